package web

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api"
	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/services"
)

// Single sign-on (OIDC), the proxy's half. The proxy speaks to the
// browser and to psh; auth speaks to the identity provider and decides
// (lib/api/authapi/sso.go has the contract). A login is two round trips
// through the browser:
//
//   - start: GET /webapi/oidc/login/web (the login page's button) or
//     POST /webapi/oidc/login/console (psh login --auth) asks auth for the
//     provider's authorization URL, which sends the browser there;
//   - finish: the provider sends the browser back to GET
//     /webapi/oidc/callback, the only redirect URI, on any proxy of the
//     cluster: what links the two halves (state, nonce, PKCE verifier)
//     is in the backend. Auth checks everything; the proxy then either
//     hands the browser its new web session (cookies, then the page the
//     user was going to) or hands psh's loopback listener the login
//     result, sealed to a key only that psh process holds.

// SSOAuthenticator is what single sign-on needs from auth: the proxy's
// *auth.Client provides it (and *auth.Server, for tests of the web server
// alone).
type SSOAuthenticator interface {
	CreateSSOAuthRequest(ctx context.Context, req authapi.SSOAuthRequest) (*authapi.SSOAuthResponse, error)
	ValidateSSOCallback(ctx context.Context, req authapi.SSOCallbackRequest) (*authapi.SSOCallbackResponse, error)
	GetSSOConnectors(ctx context.Context) ([]authapi.SSOConnectorInfo, error)
}

// Routes of single sign-on.
const (
	// SSOCallbackPath is the redirect URI to register at the identity
	// provider, on the proxy's public address.
	SSOCallbackPath    = "/webapi/oidc/callback"
	ssoWebLoginPath    = "/webapi/oidc/login/web"
	ssoConsoleLoginPth = "/webapi/oidc/login/console"
)

// maxReturnTo bounds return_to: a terminal deep link is a few hundred
// bytes; auth keeps it with the login's state.
const maxReturnTo = 2048

// maxSSOQuery bounds what the callback passes on to auth: a code and a
// state are short; an error_description is a sentence.
const maxSSOQuery = 8 << 10

// connectorsTTL is how long /webapi/ping reuses the connector list.
// Ping needs no login, so anyone may call it as often as they like: the
// auth call behind it must not be made per request. A connector added
// shows on login pages within this long.
const connectorsTTL = 10 * time.Second

// connectorsTimeout bounds the auth call behind a ping: the login page
// waits for the ping, and when auth is slow it is better shown without
// its single sign-on buttons than late.
const connectorsTimeout = 2 * time.Second

// connectorCache keeps the last answer of GetSSOConnectors, good or bad
// (a failure is not retried on every ping either).
type connectorCache struct {
	// mu guards the fields and is held during a fetch, so that one ping
	// asks auth and the others wait for its answer.
	mu      sync.Mutex
	fetched time.Time
	list    []authapi.SSOConnectorInfo
}

// ssoAuth is the auth server's single sign-on calls, nil when this web
// server has no auth (login is not available).
func (s *Server) ssoAuth() SSOAuthenticator {
	if s.cfg.Auth == nil {
		return nil
	}
	return s.cfg.Auth
}

// connectors lists the connectors for /webapi/ping, nil when there are
// none or auth could not say (the ping then simply omits them: password
// login goes on working).
func (s *Server) connectors(ctx context.Context) []authapi.SSOConnectorInfo {
	sso := s.ssoAuth()
	if sso == nil {
		return nil
	}
	c := &s.connectorCache
	c.mu.Lock()
	defer c.mu.Unlock()
	now := s.cfg.Clock.Now()
	if !c.fetched.IsZero() && now.Sub(c.fetched) < connectorsTTL && !now.Before(c.fetched) {
		return c.list
	}
	ctx, cancel := context.WithTimeout(ctx, connectorsTimeout)
	defer cancel()
	list, err := sso.GetSSOConnectors(ctx)
	if err != nil {
		s.cfg.Logger.WithError(err).Debug("Could not list the single sign-on connectors for a ping.")
		list = nil
	}
	c.list, c.fetched = list, now
	return list
}

// CheckReturnTo validates where a browser login leads once done: a path
// on this proxy, never another site. "" means "/". Refused: anything not
// starting with exactly one "/" ("//evil.example" and "/\evil.example"
// are other hosts to a browser), control characters and spaces (a
// browser drops tabs and newlines from URLs, which would turn "/\t/x"
// into "//x"), backslashes anywhere, and anything a URL parser reads
// with a scheme or a host.
func CheckReturnTo(p string) (string, error) {
	if p == "" {
		return "/", nil
	}
	if len(p) > maxReturnTo {
		return "", trace.BadParameter("return_to is longer than %d bytes", maxReturnTo)
	}
	if p[0] != '/' || strings.HasPrefix(p, "//") || strings.ContainsRune(p, '\\') {
		return "", trace.BadParameter("return_to must be a path on this proxy, starting with one \"/\"")
	}
	for _, r := range p {
		if r <= ' ' || r == 0x7f {
			return "", trace.BadParameter("return_to must not contain spaces or control characters")
		}
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "", trace.BadParameter("return_to must be a path on this proxy")
	}
	return p, nil
}

// callbackURL is the redirect URI auth sends to the identity provider:
// this proxy's callback at the public address the request reached it on,
// so that the browser comes back to the name it used (its cookies are
// there). The request's Host is taken only when it is one of the proxy's
// configured web addresses (a Host header is the client's to write, and
// the provider must see a registered URI); otherwise the first of them.
func (s *Server) callbackURL(r *http.Request) string {
	host := s.publicWebAddr(r.Host)
	return (&url.URL{Scheme: "https", Host: host, Path: SSOCallbackPath}).String()
}

// publicWebAddr picks the address of callbackURL.
func (s *Server) publicWebAddr(reqHost string) string {
	want := normalizeWebAddr(reqHost)
	for _, a := range s.webAddrs() {
		if want != "" && normalizeWebAddr(a) == want {
			return a
		}
	}
	if addrs := s.webAddrs(); len(addrs) > 0 {
		return addrs[0]
	}
	return reqHost
}

// webAddrs are Config.PublicWebAddrs, else the address the server listens
// on.
func (s *Server) webAddrs() []string {
	if len(s.cfg.PublicWebAddrs) > 0 {
		return s.cfg.PublicWebAddrs
	}
	if a, _ := s.listenAddr.Load().(string); a != "" {
		return []string{a}
	}
	return nil
}

// normalizeWebAddr lower-cases a HOST[:PORT] and drops the https default
// port, so that "Proxy.example.com:443" and "proxy.example.com" compare
// equal.
func normalizeWebAddr(a string) string {
	a = strings.ToLower(strings.TrimSpace(a))
	if h, p, err := net.SplitHostPort(a); err == nil {
		if p == "443" {
			if strings.Contains(h, ":") {
				return "[" + h + "]"
			}
			return h
		}
		return net.JoinHostPort(h, p)
	}
	return a
}

// ssoWebLogin serves GET /webapi/oidc/login/web?connector=NAME&return_to=PATH:
// the login page's "Sign in with ..." button. A plain link, not a script
// call, so that the browser follows the redirect to the provider itself.
func (s *Server) ssoWebLogin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	sso := s.ssoAuth()
	if sso == nil || !s.cfg.WebSessions.enabled() || s.cfg.WebSessions.Certs == nil {
		// A browser session made by auth is served through Certs
		// (sessionshared.go): without them the session could not be
		// used here.
		s.ssoErrorPage(w, http.StatusNotImplemented, "Single sign-on is not available on this proxy.")
		return
	}
	q := r.URL.Query()
	connector := q.Get("connector")
	if err := checkConnectorName(connector); err != nil {
		s.ssoErrorPage(w, http.StatusBadRequest, trace.UserMessage(err))
		return
	}
	returnTo, err := CheckReturnTo(q.Get("return_to"))
	if err != nil {
		s.ssoErrorPage(w, http.StatusBadRequest, "This sign-in link is not valid: "+trace.UserMessage(err)+".")
		return
	}
	log := s.cfg.Logger.WithFields(logrus.Fields{"connector": connector, "remote_addr": remoteHost(r.RemoteAddr)})
	ctx, cancel := context.WithTimeout(r.Context(), loginTimeout)
	defer cancel()
	resp, err := sso.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{
		Connector: connector, RedirectURL: s.callbackURL(r), ReturnTo: returnTo,
	})
	if err != nil {
		code, msg := s.ssoStartError(log, err, connector)
		s.ssoErrorPage(w, code, msg)
		return
	}
	if err := checkAuthURL(resp.AuthURL); err != nil {
		internalID := s.logInternal(log, "Single sign-on: auth answered an unusable authorization URL.", err)
		s.ssoErrorPage(w, http.StatusInternalServerError, internalMessage(internalID))
		return
	}
	state := authURLState(resp.AuthURL)
	if state == "" {
		id := s.logInternal(log, "Single sign-on: auth's authorization URL carries no state.", trace.BadParameter("no state in %q", resp.AuthURL))
		s.ssoErrorPage(w, http.StatusInternalServerError, internalMessage(id))
		return
	}
	setSSOBindingCookie(w, state, s.cfg.Clock.Now())
	log.Debug("Single sign-on started for a browser.")
	http.Redirect(w, r, resp.AuthURL, http.StatusFound)
}

// ssoBindingCookie ties a browser login to the browser that started it.
// Without it, anyone could start a login with their own account, stop at
// the provider's answer and hand the callback link to a victim, whose
// browser would then be logged in as the attacker (login CSRF) and type
// into the attacker's sessions. The cookie holds a hash of the login's
// state: the callback of a browser login is served only with it.
// SameSite=Lax, because the provider's redirect back is a cross-site
// navigation that a Strict cookie would not ride; it is useless to read
// (a hash of a single-use value) and dies with the state.
const ssoBindingCookie = "__Host-postern-sso"

func ssoBindingValue(state string) string {
	h := hashSecret("postern sso browser binding\x00" + state)
	return base64.RawURLEncoding.EncodeToString(h)
}

func setSSOBindingCookie(w http.ResponseWriter, state string, now time.Time) {
	http.SetCookie(w, &http.Cookie{
		Name: ssoBindingCookie, Value: ssoBindingValue(state), Path: "/", Expires: now.Add(authapi.SSOStateTTL),
		MaxAge: int(authapi.SSOStateTTL / time.Second), HttpOnly: true, Secure: true, SameSite: http.SameSiteLaxMode,
	})
}

func clearSSOBindingCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: ssoBindingCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: true, SameSite: http.SameSiteLaxMode})
}

// authURLState is the state parameter auth put in the authorization URL.
func authURLState(authURL string) string {
	u, err := url.Parse(authURL)
	if err != nil {
		return ""
	}
	return u.Query().Get("state")
}

// msgSSONotThisBrowser refuses the callback of a browser login that this
// browser did not start.
const msgSSONotThisBrowser = "This login was not started in this browser: start again from the login page."

// ssoConsoleLogin serves POST /webapi/oidc/login/console: psh login
// --auth NAME.
func (s *Server) ssoConsoleLogin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	sso := s.ssoAuth()
	if sso == nil {
		writeError(w, http.StatusNotImplemented, "login is not available on this proxy")
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
	req, err := DecodeSSOConsoleLoginRequest(data)
	if err != nil {
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
		return
	}
	log := s.cfg.Logger.WithFields(logrus.Fields{"connector": req.Connector, "remote_addr": remoteHost(r.RemoteAddr)})
	ctx, cancel := context.WithTimeout(r.Context(), loginTimeout)
	defer cancel()
	resp, err := sso.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{
		Connector:   req.Connector,
		RedirectURL: s.callbackURL(r),
		Client: &authapi.SSOClientLogin{
			PublicKey:   []byte(req.PubKey),
			TTL:         time.Duration(req.TTLSeconds) * time.Second,
			RedirectURL: req.RedirectURL,
			SealKey:     req.SealKey,
		},
	})
	if err != nil {
		code, msg := s.ssoStartError(log, err, req.Connector)
		writeError(w, code, msg)
		return
	}
	if err := checkAuthURL(resp.AuthURL); err != nil {
		internalError(w, log, "Single sign-on: auth answered an unusable authorization URL.", err)
		return
	}
	log.Debug("Single sign-on started for psh.")
	writeJSON(w, http.StatusOK, webapi.SSOConsoleLoginResponse{AuthURL: resp.AuthURL})
}

// DecodeSSOConsoleLoginRequest parses and validates psh's request: one
// JSON object, no unknown fields, a connector name, a public key, a TTL
// in range, a loopback redirect URL and a 32-byte seal key.
func DecodeSSOConsoleLoginRequest(data []byte) (*webapi.SSOConsoleLoginRequest, error) {
	var req webapi.SSOConsoleLoginRequest
	if err := api.UnmarshalStrict(data, &req); err != nil {
		return nil, trace.BadParameter("invalid login request: %v", trace.UserMessage(err))
	}
	if err := checkConnectorName(req.Connector); err != nil {
		return nil, trace.Wrap(err)
	}
	if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(req.PubKey)); err != nil {
		return nil, trace.BadParameter("invalid login request: pub_key is not an SSH public key")
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > maxTTLSeconds {
		return nil, trace.BadParameter("invalid login request: ttl_seconds must be between 0 and %d", maxTTLSeconds)
	}
	if err := CheckLoopbackRedirect(req.RedirectURL); err != nil {
		return nil, trace.Wrap(err)
	}
	if len(req.SealKey) != 32 {
		return nil, trace.BadParameter("invalid login request: seal_key must be a 32-byte X25519 public key")
	}
	return &req, nil
}

// checkConnectorName refuses what cannot be a connector's name before
// auth is asked: resource names are short and printable.
func checkConnectorName(name string) error {
	if name == "" {
		return trace.BadParameter("missing connector: name the single sign-on connector")
	}
	if len(name) > 128 || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '/' }) {
		return trace.BadParameter("invalid connector name")
	}
	return nil
}

// CheckLoopbackRedirect accepts only psh's loopback listener,
// http://127.0.0.1:PORT/PATH (or [::1]): the sealed result of a CLI login
// goes nowhere else, whatever a request (or auth's answer) says. A name
// such as localhost is refused: it resolves through files and DNS that
// are not the proxy's to trust.
func CheckLoopbackRedirect(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.User != nil || u.Opaque != "" || u.RawQuery != "" || u.Fragment != "" {
		return trace.BadParameter("redirect_url must be http://127.0.0.1:PORT/callback (psh's loopback listener)")
	}
	ip := net.ParseIP(u.Hostname())
	port, perr := strconv.Atoi(u.Port())
	if ip == nil || !ip.IsLoopback() || perr != nil || port <= 0 || port > 65535 {
		return trace.BadParameter("redirect_url must be http://127.0.0.1:PORT/callback (psh's loopback listener)")
	}
	return nil
}

// checkAuthURL checks that auth's answer is a web address to send a
// browser to.
func checkAuthURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return trace.BadParameter("authorization URL %q is not an http(s) URL", raw)
	}
	return nil
}

// ssoStartError turns auth's refusal to start a login into a status and a
// message for the user.
func (s *Server) ssoStartError(log logrus.FieldLogger, err error, connector string) (int, string) {
	switch {
	case trace.IsNotFound(err):
		return http.StatusNotFound, "There is no single sign-on connector named \"" + connector + "\"."
	case trace.IsConnectionProblem(err):
		log.WithError(err).Warn("Single sign-on could not start.")
		return http.StatusServiceUnavailable, trace.UserMessage(err)
	case trace.IsBadParameter(err), trace.IsAccessDenied(err):
		return http.StatusBadRequest, trace.UserMessage(err)
	case trace.IsLimitExceeded(err):
		return http.StatusTooManyRequests, "Too many single sign-on logins were started; try again later."
	default:
		return http.StatusInternalServerError, internalMessage(s.logInternal(log, "Single sign-on could not start.", err))
	}
}

// Messages of a failed callback, in the user's terms.
const (
	// msgSSOStale is a state auth does not hold: used already (the
	// browser went back, or the link was copied), or older than
	// authapi.SSOStateTTL.
	msgSSOStale = "This login link was already used or has expired: start again."
	// msgSSONoQuery is a callback without the provider's answer.
	msgSSONoQuery = "This page is where your identity provider sends you back after you log in; it cannot be opened on its own. Start again."
)

// ssoCallback serves GET /webapi/oidc/callback: the identity provider
// sent the browser back. Auth takes the state (once), checks the provider's
// answer and says whose login it was, and for whom: a browser (make its
// web session) or psh (pass its sealed result to its loopback listener).
func (s *Server) ssoCallback(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	sso := s.ssoAuth()
	if sso == nil {
		s.ssoErrorPage(w, http.StatusNotImplemented, "Single sign-on is not available on this proxy.")
		return
	}
	remote := remoteHost(r.RemoteAddr)
	log := s.cfg.Logger.WithField("remote_addr", remote)
	query := r.URL.RawQuery
	if query == "" {
		s.ssoErrorPage(w, http.StatusBadRequest, msgSSONoQuery)
		return
	}
	if len(query) > maxSSOQuery {
		s.ssoErrorPage(w, http.StatusBadRequest, "The identity provider's answer is too long.")
		return
	}
	// Whether this browser started this login (its binding cookie names
	// the state). Only a browser login needs it: psh's result is sealed
	// to psh's key instead, and a browser may finish a psh login while it
	// holds the cookie of another login it abandoned.
	binding := cookieValue(r, ssoBindingCookie)
	bound := binding != "" && subtle.ConstantTimeCompare([]byte(binding), []byte(ssoBindingValue(r.URL.Query().Get("state")))) == 1
	// The secrets of the web session are made before auth knows whether
	// this is a browser's login: auth creates the record only for one,
	// bound to the user the provider proved, exactly as a password login
	// does (createSession).
	ref, err := newSessionRef()
	if err != nil {
		s.ssoErrorPage(w, http.StatusInternalServerError, internalMessage(s.logInternal(log, "Single sign-on: could not make a session id.", err)))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), loginTimeout)
	defer cancel()
	resp, err := sso.ValidateSSOCallback(ctx, authapi.SSOCallbackRequest{
		Query: query, WebSession: ref.sessionInit(), RemoteAddr: remote,
	})
	if err != nil {
		code, msg := s.ssoCallbackError(log, err)
		s.ssoErrorPage(w, code, msg)
		return
	}
	log = log.WithField("user", resp.Username)
	if resp.ClientRedirectURL != "" {
		s.ssoFinishConsole(w, r, log, resp)
		return
	}
	if !bound {
		// A browser login whose start this browser never saw: somebody
		// else's login, handed over. The session auth made is dropped;
		// its secrets never left this process.
		log.Warn("Single sign-on callback of a browser login this browser did not start; refused (login CSRF?).")
		s.endSession(r.Context(), ref)
		s.ssoErrorPage(w, http.StatusBadRequest, msgSSONotThisBrowser)
		return
	}
	clearSSOBindingCookie(w)
	returnTo, err := CheckReturnTo(resp.ReturnTo)
	if err != nil {
		// Checked at the start, and by auth: never reached unless
		// something stored a bad one. The session exists; the user lands
		// on the front page with it.
		log.WithError(err).Warn("Single sign-on: auth returned an unusable return_to; sending the browser to /.")
		returnTo = "/"
	}
	// The cookie lives as long as a session may; auth's record says when
	// the session really ends (the user's roles may cap it), and the UI
	// adopts it through POST /webapi/sessions/token like a new tab does.
	setSessionCookies(w, ref, s.cfg.Clock.Now().Add(s.cfg.WebSessions.TTL))
	log.Info("Web session created by single sign-on.")
	http.Redirect(w, r, returnTo, http.StatusFound)
}

// ssoFinishConsole sends the browser to psh's loopback listener with the
// sealed login result. The proxy cannot read the result; it checks only
// that it sends it to a loopback address.
func (s *Server) ssoFinishConsole(w http.ResponseWriter, r *http.Request, log logrus.FieldLogger, resp *authapi.SSOCallbackResponse) {
	to, err := handoffURL(resp)
	if err != nil {
		id := s.logInternal(log.WithField("client_redirect_url", resp.ClientRedirectURL), "Single sign-on: auth answered a CLI login that cannot be handed to psh.", err)
		s.ssoErrorPage(w, http.StatusInternalServerError, internalMessage(id))
		return
	}
	log.Info("Single sign-on for psh done; handing the result to its loopback listener.")
	http.Redirect(w, r, to, http.StatusFound)
}

// handoffURL is where the browser takes a CLI login's sealed result:
// psh's loopback listener with ?response=BASE64URL(sealed). Only a
// loopback address, whatever auth answered (CheckLoopbackRedirect).
// Every CLI login that goes through a browser (single sign-on, the web
// login page) ends here.
func handoffURL(resp *authapi.SSOCallbackResponse) (string, error) {
	if err := CheckLoopbackRedirect(resp.ClientRedirectURL); err != nil {
		return "", trace.Wrap(err)
	}
	if len(resp.SealedLogin) == 0 {
		return "", trace.BadParameter("no sealed login")
	}
	u, _ := url.Parse(resp.ClientRedirectURL)
	u.RawQuery = url.Values{"response": {base64.RawURLEncoding.EncodeToString(resp.SealedLogin)}}.Encode()
	return u.String(), nil
}

// isSSOStateGone reports auth's answer to a state it does not hold (used,
// expired or never made): the user's fix is to start again.
func isSSOStateGone(err error) bool {
	return trace.IsNotFound(err) || (trace.IsAccessDenied(err) && strings.Contains(trace.UserMessage(err), auth.MsgSSOStateGone))
}

// ssoCallbackError turns auth's refusal of a callback into a status and a
// message for the user. Auth's messages for what the user can act on (no
// role, a provider that did not answer, a lock) are shown as they are.
func (s *Server) ssoCallbackError(log logrus.FieldLogger, err error) (int, string) {
	switch {
	case isSSOStateGone(err):
		log.Info("Single sign-on callback with a state auth does not hold (used or expired).")
		return http.StatusBadRequest, msgSSOStale
	case services.IsLocked(err):
		log.Info("Single sign-on refused: access is locked.")
		return http.StatusForbidden, trace.UserMessage(err)
	case trace.IsAccessDenied(err):
		log.WithError(err).Info("Single sign-on refused.")
		return http.StatusForbidden, trace.UserMessage(err)
	case trace.IsLimitExceeded(err):
		return http.StatusTooManyRequests, "Too many failed logins; try again later."
	case trace.IsConnectionProblem(err):
		log.WithError(err).Warn("Single sign-on failed: a server did not answer.")
		return http.StatusServiceUnavailable, trace.UserMessage(err)
	case trace.IsBadParameter(err):
		log.WithError(err).Info("Single sign-on failed.")
		return http.StatusBadRequest, trace.UserMessage(err)
	default:
		return http.StatusInternalServerError, internalMessage(s.logInternal(log, "Single sign-on failed with an internal error.", err))
	}
}

// logInternal logs an internal fault under a fresh request id and returns
// the id (see internalError).
func (s *Server) logInternal(log logrus.FieldLogger, msg string, cause error) string {
	id := newRequestID()
	log.WithError(cause).WithField("request_id", id).Warn(msg)
	return id
}

func internalMessage(id string) string {
	return "Internal error (request id " + id + "); see the proxy's log."
}

// ssoErrorPageTmpl is the page of a failed single sign-on: the browser is
// on a proxy URL, not in the app, so the answer is a page a person reads.
// html/template escapes the message (it may quote what a provider or a
// request said).
var ssoErrorPageTmpl = template.Must(template.New("sso-error").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Postern: single sign-on failed</title>
<link rel="stylesheet" href="/style.css">
</head>
<body>
<main>
<section id="sso-error">
<h1>Single sign-on failed</h1>
<p class="error" role="alert">{{.Message}}</p>
<p><a class="button" href="/">Back to the login page</a></p>
</section>
</main>
</body>
</html>
`))

// ssoErrorPage writes the error page.
func (s *Server) ssoErrorPage(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_ = ssoErrorPageTmpl.Execute(w, struct{ Message string }{msg})
}
