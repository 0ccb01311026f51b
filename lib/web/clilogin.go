package web

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api"
	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
)

// psh login --auth web, the proxy's half (lib/auth/clilogin.go has the
// policy). psh asks for a login request (POST /webapi/login/console) and
// opens CLILoginPagePath?id=ID on the address it was given; the page logs
// the browser in as it always does (password, second factors, passkeys,
// single sign-on), the user approves, and the page asks for psh's
// certificate (POST /webapi/login/console/finish) and takes the sealed
// result to psh's loopback listener (handoffURL), as after a single
// sign-on login. psh thus needs no FIDO library to log in with a passkey.

// CLILoginPagePath is the web UI's page of a psh login.
const CLILoginPagePath = "/web/cli-login"

// CLILoginAuthenticator is what these endpoints need from auth (its
// *auth.Server and *auth.Client provide it).
type CLILoginAuthenticator interface {
	CreateCLILogin(ctx context.Context, cl authapi.SSOClientLogin) (*authapi.CLILoginResponse, error)
	FinishCLILogin(ctx context.Context, req authapi.CLILoginFinishRequest) (*authapi.SSOCallbackResponse, error)
}

var (
	_ CLILoginAuthenticator = (*auth.Server)(nil)
	_ CLILoginAuthenticator = (*auth.Client)(nil)
)

func (s *Server) cliLoginAuth(w http.ResponseWriter) (CLILoginAuthenticator, bool) {
	a, ok := s.cfg.Auth.(CLILoginAuthenticator)
	if !ok || s.cfg.Auth == nil || !s.cfg.WebSessions.enabled() {
		writeError(w, http.StatusNotImplemented, "psh login --auth web is not available on this proxy")
		return nil, false
	}
	return a, true
}

// DecodeWebConsoleLoginRequest parses and validates psh's request: one
// JSON object, no unknown fields, a public key, a TTL in range, a
// loopback redirect URL and a 32-byte seal key.
func DecodeWebConsoleLoginRequest(data []byte) (*webapi.WebConsoleLoginRequest, error) {
	var req webapi.WebConsoleLoginRequest
	if err := api.UnmarshalStrict(data, &req); err != nil {
		return nil, trace.BadParameter("invalid login request: %v", trace.UserMessage(err))
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

// webConsoleLogin serves POST /webapi/login/console (psh).
func (s *Server) webConsoleLogin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	a, ok := s.cliLoginAuth(w)
	if !ok {
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
	req, err := DecodeWebConsoleLoginRequest(data)
	if err != nil {
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
		return
	}
	log := s.cfg.Logger.WithField("remote_addr", remoteHost(r.RemoteAddr))
	ctx, cancel := context.WithTimeout(r.Context(), loginTimeout)
	defer cancel()
	resp, err := a.CreateCLILogin(ctx, authapi.SSOClientLogin{
		PublicKey: []byte(req.PubKey), TTL: time.Duration(req.TTLSeconds) * time.Second,
		RedirectURL: req.RedirectURL, SealKey: req.SealKey,
	})
	if err != nil {
		writeCLILoginError(w, log, err)
		return
	}
	log.Debug("A psh login through the web login page started.")
	writeJSON(w, http.StatusOK, webapi.WebConsoleLoginResponse{Path: CLILoginPagePath + "?" + url.Values{"id": {resp.ID}}.Encode()})
}

// webConsoleFinish serves POST /webapi/login/console/finish: the
// browser's session gives psh its certificate. A register-only session
// never gets here (requireSession).
func (s *Server) webConsoleFinish(w http.ResponseWriter, r *http.Request, live *liveSession) {
	w.Header().Set("Cache-Control", "no-store")
	a, ok := s.cliLoginAuth(w)
	if !ok {
		return
	}
	if err := checkLoginOrigin(r); err != nil {
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
		return
	}
	var req webapi.WebConsoleFinishRequest
	data, ok := readMFABodyBytes(w, r)
	if !ok {
		return
	}
	if err := api.UnmarshalStrict(data, &req); err != nil || req.ID == "" || len(req.ID) > 128 || strings.ContainsFunc(req.ID, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		writeError(w, http.StatusBadRequest, "invalid request: expected {\"id\"} of the psh login")
		return
	}
	remote := remoteHost(r.RemoteAddr)
	log := s.cfg.Logger.WithFields(logrus.Fields{"user": live.user, "remote_addr": remote})
	ctx, cancel := context.WithTimeout(r.Context(), loginTimeout)
	defer cancel()
	resp, err := a.FinishCLILogin(ctx, authapi.CLILoginFinishRequest{
		WebSessionRequest: sessionRequest(live), ID: req.ID, ChallengeID: req.ChallengeID, WebAuthn: req.WebAuthn, RemoteAddr: remote,
	})
	if err != nil {
		writeCLILoginError(w, log, err)
		return
	}
	to, err := handoffURL(resp)
	if err != nil {
		internalError(w, log.WithField("client_redirect_url", resp.ClientRedirectURL), "psh login: auth answered a result that cannot be handed to psh.", err)
		return
	}
	log.Info("psh login through the web login page done; handing the result to its loopback listener.")
	writeJSON(w, http.StatusOK, webapi.WebConsoleFinishResponse{RedirectURL: to})
}

// writeCLILoginError maps auth's answer: a refusal says why (it names
// nothing the user did not do), bad input 400, auth away 503.
func writeCLILoginError(w http.ResponseWriter, log logrus.FieldLogger, err error) {
	switch {
	case trace.IsAccessDenied(err):
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
	case trace.IsBadParameter(err):
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
	case trace.IsConnectionProblem(err):
		writeError(w, http.StatusServiceUnavailable, msgAuthUnavailable)
	default:
		internalError(w, log, "psh login through the web login page failed with an internal error.", err)
	}
}

// webConsoleChallenge serves POST /webapi/login/console/challenge: the
// passkey challenge with which the page confirms a psh session (psh ssh
// to a node a require_session_mfa role reaches).
func (s *Server) webConsoleChallenge(w http.ResponseWriter, r *http.Request, live *liveSession) {
	a, ok := s.sessionMFAAuth(w)
	if !ok {
		return
	}
	ch, err := a.BeginSessionMFA(r.Context(), authapi.SessionMFABeginRequest{SessionMFAIdentity: authapi.SessionMFAIdentity{WebSession: ptr(sessionRequest(live))}})
	if err != nil {
		writeMFAError(w, s.cfg.Logger.WithField("user", live.user), err)
		return
	}
	writeJSON(w, http.StatusOK, ch)
}
