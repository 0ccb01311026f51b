package web

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/url"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api"
	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
)

// The login and logout handlers of web sessions: POST and DELETE
// /webapi/sessions. They create and end what sessionstore.go and
// sessionregistry.go keep.

func randomHex() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", trace.Wrap(err)
	}
	return hex.EncodeToString(b[:]), nil
}

// checkLoginOrigin refuses a cross-site login POST (login CSRF: a page
// that logs the victim's browser into the attacker's account). Browsers
// send Sec-Fetch-Site on every request they make; a non-browser client
// (psh, curl) sends neither header and is not a CSRF vector.
func checkLoginOrigin(r *http.Request) error {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return trace.AccessDenied("cross-site login refused")
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return trace.AccessDenied("cross-origin login refused")
		}
	}
	return nil
}

// createSession serves POST /webapi/sessions.
func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Auth == nil || !s.cfg.WebSessions.enabled() {
		writeError(w, http.StatusNotImplemented, "web sessions are not available on this proxy")
		return
	}
	if err := checkLoginOrigin(r); err != nil {
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
		return
	}
	data, ok := readLoginBody(w, r)
	if !ok {
		return
	}
	var req webapi.CreateSessionRequest
	if err := api.UnmarshalStrict(data, &req); err != nil || req.User == "" {
		writeError(w, http.StatusBadRequest, "invalid login request: expected {\"user\",\"password\",\"otp_token\"}")
		return
	}
	remote := remoteHost(r.RemoteAddr)
	log := s.cfg.Logger.WithFields(logrus.Fields{"user": req.User, "remote_addr": remote})

	s.issueWebSession(w, r, log, func(ctx context.Context, pub []byte, ttl time.Duration, init *authapi.WebSessionInit) (*authapi.SSHLoginResponse, error) {
		// One auth call checks the password and OTP (under auth's
		// per-user and per-address failure limits, shared with psh's
		// login) and certifies the session's key: the key never leaves
		// this process. With sessions kept by auth, the same call stores
		// the session's record (hashes only), bound to the user the
		// password proved.
		return s.cfg.Auth.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{
			AuthRequest: authapi.AuthRequest{User: req.User, Password: req.Password, OTP: req.OTPToken, RemoteAddr: remote},
			PublicKey:   pub, TTL: ttl, WebSession: init,
		})
	})
}

// issueWebSession makes a browser session's key and secrets, has login
// (a password login, or a passkey login's finish) check the credentials
// and certify the key, and hands the session to the browser.
func (s *Server) issueWebSession(w http.ResponseWriter, r *http.Request, log logrus.FieldLogger, login func(ctx context.Context, pub []byte, ttl time.Duration, init *authapi.WebSessionInit) (*authapi.SSHLoginResponse, error)) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		internalError(w, log, "Web login: could not generate the session key.", err)
		return
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		internalError(w, log, "Web login: could not encode the session key.", err)
		return
	}
	cfg := s.cfg.WebSessions
	ref, err := newSessionRef()
	if err != nil {
		internalError(w, log, "Web login: could not make a session id.", err)
		return
	}
	token := ref.Token
	atLogin := sessionsCreatedAtLogin(cfg.Store)
	var init *authapi.WebSessionInit
	if atLogin {
		init = ref.sessionInit()
	}
	resp, ok := s.callLogin(w, r, log, func(ctx context.Context) (*authapi.SSHLoginResponse, error) {
		return login(ctx, ssh.MarshalAuthorizedKey(sshPub), cfg.TTL, init)
	})
	if !ok {
		return
	}
	now := s.cfg.Clock.Now()
	expires := now.Add(cfg.TTL)
	var live *liveSession
	if resp.RegisterOnly {
		live = &liveSession{user: resp.Username, registerOnly: true}
		if end := now.Add(auth.RegisterOnlyTTL); end.Before(expires) {
			expires = end
		}
	} else {
		live, err = newLiveSession(priv, resp, s.cfg.ClusterName)
		if err != nil {
			internalError(w, log, "Web login: unusable certificate from auth.", err)
			return
		}
		if certEnd := time.Unix(int64(live.cert.ValidBefore), 0); certEnd.Before(expires) {
			expires = certEnd
		}
	}
	live.setRef(ref)
	live.expires = expires
	if !atLogin {
		rec := SessionRecord{User: resp.Username, TokenHash: hashSecret(token), Created: now, Expires: expires, LastActive: now, RegisterOnly: resp.RegisterOnly}
		if err := cfg.Store.CreateSession(r.Context(), live.ref, rec); err != nil {
			internalError(w, log, "Could not store a web session.", err)
			return
		}
	}
	live.ctx, live.cancel = context.WithCancelCause(s.web.ctx)
	s.web.sessions.add(live)
	setSessionCookies(w, ref, expires)
	log.WithField("register_only", resp.RegisterOnly).Info("Web session created.")
	writeJSON(w, http.StatusOK, webapi.CreateSessionResponse{Token: token, Expires: expires.UTC(), User: resp.Username, RegisterOnly: resp.RegisterOnly})
}

// deleteSession serves DELETE /webapi/sessions: the record goes, every
// terminal opened with the session on this proxy ends, and its cookies
// are cleared.
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, live *liveSession) {
	s.endSession(r.Context(), live.ref)
	clearSessionCookie(w, sessionCookieFor(bearerToken(r)))
	// The plain cookie only when it is this session's: it may name a
	// later login of another tab, which goes on.
	if c, err := r.Cookie(SessionCookieName); err == nil && hex.EncodeToString(hashSecret(c.Value)) == live.key {
		clearSessionCookie(w, SessionCookieName)
	}
	s.cfg.Logger.WithField("user", live.user).Info("Web session deleted.")
	w.WriteHeader(http.StatusNoContent)
}

// newSessionRef makes a new browser session's secrets: the id (the
// cookie) and the bearer token derived from it. Every browser login makes
// them here, with a password (createSession) or through an identity
// provider (ssoCallback), so both kinds of session are alike.
func newSessionRef() (SessionRef, error) {
	sid, err := randomHex()
	if err != nil {
		return SessionRef{}, trace.Wrap(err)
	}
	return SessionRef{ID: sid, Token: sessionTokenFor(sid)}, nil
}

// sessionInit is what auth stores of a new session when it creates the
// record: hashes only.
func (r SessionRef) sessionInit() *authapi.WebSessionInit {
	return &authapi.WebSessionInit{Key: r.Key(), TokenHash: hashSecret(r.Token)}
}

// setSessionCookies hands a new session to the browser. The plain cookie
// names the browser's latest login (a new tab adopts it); the session's
// own cookie keeps this session working in its tab after another tab logs
// in (sessionauth.go).
func setSessionCookies(w http.ResponseWriter, ref SessionRef, expires time.Time) {
	setSessionCookie(w, SessionCookieName, ref.ID, expires)
	setSessionCookie(w, sessionCookieFor(ref.Token), ref.ID, expires)
}

// setSessionCookie sets a session cookie: HttpOnly (no page script reads
// it), Secure with the __Host- prefix, and SameSite=Strict (no cross-site
// request carries it).
func setSessionCookie(w http.ResponseWriter, name, sid string, expires time.Time) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: sid, Path: "/", Expires: expires,
		HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode,
	})
}

func clearSessionCookie(w http.ResponseWriter, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
}
