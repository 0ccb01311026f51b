package web

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// The middleware of web sessions: every session call is checked here
// (cookie plus bearer token, expiry, locks) before its handler runs.

// A web session is the session id in an HttpOnly cookie (page scripts
// cannot read it) plus the bearer token in the Authorization header (which
// a cross-site page cannot set). A request needs both, which is the CSRF
// defence of every API call: a forged form or image carries the cookie but
// never the header, and a script that stole the token from the page has no
// cookie on another origin.
//
// One browser, many tabs. The token is derived from the session id
// (sessionTokenFor), so a new tab of the same browser, which has the
// cookie but not the token (the token lives in the tab's sessionStorage),
// gets it back from POST /webapi/sessions/token (sessiontab.go): a
// same-origin call that a cross-site page can neither make with the
// cookie (SameSite=Strict, Sec-Fetch-Site) nor read the answer of (no
// CORS). A deep link opened in a new tab needs no second login. And a
// login never ends another tab's session: every session has a cookie of
// its own, named for its token (sessionCookieFor), so a second login adds
// a cookie instead of replacing the first tab's. The plain cookie
// (SessionCookieName) is set too, for the latest login: it is what a new
// tab adopts, and what non-browser clients (psh, tests) send.
//
// The backend keeps only hashes of both (a leaked backend dump does not
// log anybody in) and the expiries. The private key and the user
// certificate live in this proxy's memory only: they never reach the
// backend or the browser. Another proxy, or this one after a restart,
// serves the same session with a key of its own (sessionshared.go).

// SessionCookieName is the cookie of the browser's latest web session;
// each session also has its own, SessionCookieName + "-" + a tag of its
// token. The __Host- prefix makes the browser refuse them unless they are
// Secure, Path=/ and without a Domain, so a sibling subdomain cannot
// plant or read them.
const SessionCookieName = "__Host-session"

// sessionCookieFor names the cookie of the session whose bearer token is
// token: 64 bits of the token's hash, enough to keep a browser's few
// sessions apart, and nothing an attacker could use (the hash is one-way
// and the name is sent only with the cookie itself).
func sessionCookieFor(token string) string {
	return SessionCookieName + "-" + hex.EncodeToString(hashSecret(token)[:8])
}

// sessionTokenFor derives a session's bearer token from its id. An HMAC
// keyed by the 256-bit id: whoever holds the cookie can compute the token
// (the server, for a new tab of the same browser), and nobody can get the
// cookie back from the token.
func sessionTokenFor(sid string) string {
	m := hmac.New(sha256.New, []byte(sid))
	m.Write([]byte("postern web session bearer token"))
	return hex.EncodeToString(m.Sum(nil))
}

// sessionCookie is the session id the request carries for token: the
// session's own cookie, else the plain one (a session created before
// per-session cookies existed, or a non-browser client).
func sessionCookie(r *http.Request, token string) string {
	if c, err := r.Cookie(sessionCookieFor(token)); err == nil && c.Value != "" {
		return c.Value
	}
	if c, err := r.Cookie(SessionCookieName); err == nil {
		return c.Value
	}
	return ""
}

// Defaults of the web session lifetimes.
const (
	// DefaultSessionIdleTTL ends a session nobody used for half an hour:
	// an unattended browser tab should not stay a way into every node.
	DefaultSessionIdleTTL = 30 * time.Minute
	// DefaultSessionTTL is the absolute bound, a working day; the user
	// certificate behind the session is also capped by the roles'
	// max_session_ttl, and the session never outlives it.
	DefaultSessionTTL = 8 * time.Hour
	// touchInterval bounds backend writes: the idle expiry is pushed
	// forward at most once a minute per session, not on every request.
	touchInterval = time.Minute
)

func hashSecret(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// errNoSession is every authentication failure of a session call: the
// caller learns nothing about which part was wrong.
var errNoSession = trace.AccessDenied("missing or invalid web session; log in again")

// errAuthUnavailable is a session call that could not be checked because
// auth (or its backend) cannot be reached: 503, not 401.
var errAuthUnavailable = trace.ConnectionProblem(nil, msgAuthUnavailable)

// bearerToken reads "Authorization: Bearer TOKEN".
func bearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) > len(prefix) && strings.EqualFold(h[:len(prefix)], prefix) {
		return strings.TrimSpace(h[len(prefix):])
	}
	return ""
}

// authenticate checks the token and the session cookie that goes with it
// (sessionCookie) against the store. A register-only session is refused
// (errRegisterOnly): only authenticateAny's callers serve it.
func (s *Server) authenticate(ctx context.Context, r *http.Request, token string) (*liveSession, error) {
	live, err := s.authenticateAny(ctx, r, token)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if live.registerOnly {
		return nil, errRegisterOnly
	}
	return live, nil
}

// authenticateAny is authenticate that also returns register-only
// sessions.
func (s *Server) authenticateAny(ctx context.Context, r *http.Request, token string) (*liveSession, error) {
	if token == "" {
		return nil, errNoSession
	}
	return s.checkSession(ctx, sessionCookie(r, token), token)
}

// checkSession checks a session id and token against the store and
// returns the live session, recording activity.
func (s *Server) checkSession(ctx context.Context, sid, token string) (*liveSession, error) {
	if sid == "" || token == "" {
		return nil, errNoSession
	}
	ref := SessionRef{ID: sid, Token: token}
	key := ref.Key()
	cfg := s.cfg.WebSessions
	rec, err := cfg.Store.GetSession(ctx, ref)
	if err != nil {
		if trace.IsNotFound(err) {
			return nil, errNoSession
		}
		s.cfg.Logger.WithError(err).Warn("Could not read a web session.")
		if trace.IsConnectionProblem(err) {
			// The session may well be valid: say the trouble is ours
			// (503), so the browser keeps it and tries again.
			return nil, errAuthUnavailable
		}
		return nil, errNoSession
	}
	if subtle.ConstantTimeCompare(rec.TokenHash, hashSecret(token)) != 1 {
		return nil, errNoSession
	}
	now := s.cfg.Clock.Now()
	if !now.Before(rec.Expires) || !now.Before(rec.LastActive.Add(cfg.IdleTTL)) {
		s.endSession(ctx, ref)
		return nil, errNoSession
	}
	live := s.web.sessions.get(key)
	if live == nil && rec.RegisterOnly {
		// No key to get: auth certifies none for it.
		live = s.adoptRegisterOnly(ref, rec)
	}
	if live == nil {
		// Created by another proxy (or before a restart): its key is not
		// here. With Certs this proxy gets a key of its own
		// (sessionshared.go); without, the session cannot be used here.
		if cfg.Certs == nil {
			return nil, errNoSession
		}
		live, err = s.adoptSession(ctx, ref, rec)
		if err != nil {
			if trace.IsAccessDenied(err) {
				return nil, errNoSession
			}
			s.cfg.Logger.WithError(err).Warn("Could not serve a web session created on another proxy.")
			if trace.IsConnectionProblem(err) {
				return nil, errAuthUnavailable
			}
			return nil, errNoSession
		}
	}
	if live, err = s.checkLocks(live); err != nil {
		if services.IsLocked(err) {
			s.endSessionCause(ctx, ref, err)
		}
		return nil, trace.AccessDenied("%s", lockRefusal(err))
	}
	if now.Sub(rec.LastActive) >= touchInterval {
		rec.LastActive = now
		if err := cfg.Store.UpdateSession(ctx, ref, *rec); err != nil {
			s.cfg.Logger.WithError(err).Warn("Could not record web session activity.")
		}
	}
	return live, nil
}

// touchSession records use of a session by a running terminal, so a user
// working in a terminal for hours is not idle-expired under it.
func (s *Server) touchSession(ctx context.Context, key string) {
	live := s.web.sessions.get(key)
	if live == nil {
		return
	}
	store := s.cfg.WebSessions.Store
	rec, err := store.GetSession(ctx, live.ref)
	if err != nil {
		return
	}
	rec.LastActive = s.cfg.Clock.Now()
	if err := store.UpdateSession(ctx, live.ref, *rec); err != nil {
		s.cfg.Logger.WithError(err).Warn("Could not record web session activity.")
	}
}

// endSession deletes the record and ends the terminals that use it.
func (s *Server) endSession(ctx context.Context, ref SessionRef) {
	if err := s.cfg.WebSessions.Store.DeleteSession(ctx, ref); err != nil && !trace.IsNotFound(err) {
		s.cfg.Logger.WithError(err).Warn("Could not delete a web session.")
	}
	s.web.sessions.remove(ref.Key())
}

// requireSession wraps an API handler with the cookie + bearer check; a
// register-only session is refused (403).
func (s *Server) requireSession(next func(http.ResponseWriter, *http.Request, *liveSession)) http.HandlerFunc {
	return s.sessionHandler(s.authenticate, next)
}

// requireAnySession is requireSession for the calls a register-only
// session may make too: list and register second factors, log out.
func (s *Server) requireAnySession(next func(http.ResponseWriter, *http.Request, *liveSession)) http.HandlerFunc {
	return s.sessionHandler(s.authenticateAny, next)
}

func (s *Server) sessionHandler(check func(context.Context, *http.Request, string) (*liveSession, error), next func(http.ResponseWriter, *http.Request, *liveSession)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.cfg.WebSessions.enabled() {
			writeError(w, http.StatusNotImplemented, "web sessions are not available on this proxy")
			return
		}
		live, err := check(r.Context(), r, bearerToken(r))
		if err != nil {
			code := http.StatusUnauthorized
			switch {
			case trace.IsConnectionProblem(err):
				code = http.StatusServiceUnavailable
			case errors.Is(err, errRegisterOnly):
				code = http.StatusForbidden
			}
			writeError(w, code, trace.UserMessage(err))
			return
		}
		next(w, r, live)
	}
}
