package web

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/webapi"
)

// A new tab of a browser that is logged in: POST /webapi/sessions/token
// gives it the bearer token of the browser's session, so that a deep link
// opened in a new tab (or a second tab of the UI) works without a second
// login, which would be a second session (sessionauth.go explains why
// that no longer ends the first one).
//
// The answer is the token, a secret, so the call must be one only the
// UI's own pages can make and read:
//   - SameSite=Strict: no cross-site request carries the cookie, so a
//     forged request has no session to ask about.
//   - Sec-Fetch-Site must be same-origin (or absent: a non-browser
//     client, which needs the cookie and could derive the token from it
//     anyway); a sibling subdomain (same-site) is refused.
//   - An Origin header must name this host.
//   - The answer carries no CORS header, so no other origin's script
//     can read it, and Cache-Control: no-store keeps it out of caches.
// It is a POST so that no <img>, <script> or link prefetch can make it.

// maxTabCookies bounds the per-session cookies tried when the plain
// cookie names no live session: each costs a store read. A browser has a
// few (one per login in its last working day); more is a stuffed jar.
const maxTabCookies = 8

// msgNoBrowserSession answers a new tab of a browser with no live web
// session: the UI shows its login form.
const msgNoBrowserSession = "no web session in this browser; log in"

// checkSameOriginFetch refuses a request that a browser did not make from
// one of this proxy's own pages.
func checkSameOriginFetch(r *http.Request) error {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin":
	default:
		return trace.AccessDenied("only this site's pages may ask for the session token")
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return trace.AccessDenied("cross-origin request refused")
		}
	}
	return nil
}

// browserSessionIDs lists the session ids the request's cookies carry:
// the plain cookie (the latest login) first, then the per-session ones,
// each once.
func browserSessionIDs(r *http.Request) []string {
	var out []string
	seen := map[string]bool{}
	add := func(v string) {
		if v != "" && !seen[v] && len(out) < 1+maxTabCookies {
			seen[v] = true
			out = append(out, v)
		}
	}
	if c, err := r.Cookie(SessionCookieName); err == nil {
		add(c.Value)
	}
	for _, c := range r.Cookies() {
		if strings.HasPrefix(c.Name, SessionCookieName+"-") {
			add(c.Value)
		}
	}
	return out
}

// sessionTokenForTab serves POST /webapi/sessions/token: the token of the
// browser's latest live session (the plain cookie's), else of the one of
// its per-session cookies that lasts longest, checked like any session
// call (expiry, idle time, locks).
func (s *Server) sessionTokenForTab(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.WebSessions.enabled() {
		writeError(w, http.StatusNotImplemented, "web sessions are not available on this proxy")
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if err := checkSameOriginFetch(r); err != nil {
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
		return
	}
	latest := cookieValue(r, SessionCookieName)
	var (
		token   string
		best    *liveSession
		lastErr error
	)
	for _, sid := range browserSessionIDs(r) {
		tok := sessionTokenFor(sid)
		live, err := s.checkSession(r.Context(), sid, tok)
		if err != nil {
			lastErr = err
			continue
		}
		if best == nil || sid == latest || live.expires.After(best.expires) {
			token, best = tok, live
		}
		if sid == latest {
			break
		}
	}
	if best == nil {
		switch {
		case lastErr == nil || lastErr == errNoSession:
			writeError(w, http.StatusUnauthorized, msgNoBrowserSession)
		case trace.IsConnectionProblem(lastErr):
			writeError(w, http.StatusServiceUnavailable, trace.UserMessage(lastErr))
		default:
			// A locked user: said as any session call says it.
			writeError(w, http.StatusUnauthorized, trace.UserMessage(lastErr))
		}
		return
	}
	writeJSON(w, http.StatusOK, webapi.CreateSessionResponse{Token: token, Expires: best.expires.UTC(), User: best.user, RegisterOnly: best.registerOnly})
}

func cookieValue(r *http.Request, name string) string {
	if c, err := r.Cookie(name); err == nil {
		return c.Value
	}
	return ""
}
