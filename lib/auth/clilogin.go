package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// CLI logins through the web login page (psh login --auth web; the
// contract is in lib/api/authapi/clilogin.go). psh needs no FIDO library:
// the browser does the passkey, and the result comes back sealed to psh's
// ephemeral key exactly as a single sign-on result does (sealLogin, and
// the proxy's loopback redirect). The request is single use, lives
// authapi.SSOStateTTL, and is finished only with a web session created
// after it: a session the browser already had does not hand a
// certificate to a psh that somebody else started (the user logs in, on
// that page, for this psh).

const cliLoginsPrefix = "cli_logins"

// methodWebCLI is the audited method of a certificate issued to psh
// through the web login page.
const methodWebCLI = "web"

// cliLogin is what a started CLI login keeps for its finish.
type cliLogin struct {
	Client  authapi.SSOClientLogin `json:"client"`
	Created time.Time              `json:"created"`
	// User and Session are set for a per-session confirmation
	// (CreateSessionMFALogin): the result is a per-session certificate
	// for that session, after a passkey of that user.
	User    string                     `json:"user,omitempty"`
	Session *services.SessionMFATarget `json:"session,omitempty"`
}

// cliLoginKey is the backend key of a request: under its id's hash, so a
// backend dump does not hand out ids.
func cliLoginKey(id string) string {
	sum := sha256.Sum256([]byte("postern cli login\x00" + id))
	return backend.Key(cliLoginsPrefix, hex.EncodeToString(sum[:]))
}

// checkClientLogin validates what psh sent: a plain SSH key, a TTL, its
// loopback listener and a 32-byte seal key (as for a single sign-on login).
func checkClientLogin(cl *authapi.SSOClientLogin) error {
	if _, err := parseAuthorizedKey(cl.PublicKey); err != nil {
		return trace.Wrap(err)
	}
	if cl.TTL < 0 {
		return trace.BadParameter("negative ttl")
	}
	if err := CheckClientRedirectURL(cl.RedirectURL); err != nil {
		return trace.Wrap(err)
	}
	if len(cl.SealKey) != 32 {
		return trace.BadParameter("seal_key must be a 32-byte X25519 public key, got %d bytes", len(cl.SealKey))
	}
	return nil
}

// CreateCLILogin starts a CLI login through the web login page.
func (s *Server) CreateCLILogin(ctx context.Context, cl authapi.SSOClientLogin) (*authapi.CLILoginResponse, error) {
	if err := checkClientLogin(&cl); err != nil {
		return nil, trace.Wrap(err)
	}
	return s.storeCLILogin(ctx, cliLogin{Client: cl, Created: s.clock.Now().UTC()})
}

// CreateSessionMFALogin starts the confirmation of one psh session with
// a passkey in the browser: psh's certificate names the user, who must
// be the one logged in on the page.
func (s *Server) CreateSessionMFALogin(ctx context.Context, req authapi.SessionMFALoginRequest) (*authapi.CLILoginResponse, error) {
	if req.WebSession != nil {
		return nil, trace.BadParameter("psh names the user by its certificate")
	}
	user, err := s.sessionMFAUser(ctx, req.SessionMFAIdentity)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := checkClientLogin(&req.Client); err != nil {
		return nil, trace.Wrap(err)
	}
	node, err := s.checkSessionTarget(ctx, user, req.Cluster, req.Node, req.Login)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.storeCLILogin(ctx, cliLogin{
		Client: req.Client, Created: s.clock.Now().UTC(), User: user.Name,
		Session: &services.SessionMFATarget{Cluster: s.cfg.ClusterName, Node: node.UUID, Login: req.Login},
	})
}

// storeCLILogin keeps a CLI login request under a new id.
func (s *Server) storeCLILogin(ctx context.Context, cl cliLogin) (*authapi.CLILoginResponse, error) {
	id := randomToken()
	data, err := json.Marshal(cl)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	expires := s.store.Backend().Clock().Now().Add(authapi.SSOStateTTL)
	if _, err := s.store.Backend().Create(ctx, backend.Item{Key: cliLoginKey(id), Value: data, Expires: expires}); err != nil {
		return nil, trace.Wrap(err)
	}
	return &authapi.CLILoginResponse{ID: id}, nil
}

// MsgCLILoginGone answers an id that is unknown, expired or already used.
const MsgCLILoginGone = "unknown, expired or already finished psh login: run psh login again"

// MsgCLILoginStale answers a finish with a web session older than the
// request: the user logs in again on the page.
const MsgCLILoginStale = "log in again on this page to give psh a certificate: this browser's session is older than the psh login"

// FinishCLILogin issues the certificate of a CLI login to the user of the
// web session req names, sealed to psh's key. Refused: a register-only
// session, a session created before the request, a request used or
// expired. Every refusal after the session was recognized is audited.
func (s *Server) FinishCLILogin(ctx context.Context, req authapi.CLILoginFinishRequest) (resp *authapi.SSOCallbackResponse, err error) {
	_, ws, err := s.webSessionBySecret(ctx, req.SessionID, req.Token)
	if err != nil {
		return nil, trace.AccessDenied("invalid or expired web session")
	}
	defer func() {
		if err != nil {
			s.emitLoginMethod(ctx, events.AuthFailed, ws.User, req.RemoteAddr, methodWebCLI, auditReason(err))
		}
	}()
	if ws.RegisterOnly {
		return nil, trace.AccessDenied("register a second factor first, then log in again")
	}
	key := cliLoginKey(req.ID)
	item, err := s.store.Backend().Get(ctx, key)
	if trace.IsNotFound(err) {
		return nil, trace.AccessDenied(MsgCLILoginGone)
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var cl cliLogin
	if err := json.Unmarshal(item.Value, &cl); err != nil {
		return nil, trace.BadParameter("corrupt CLI login record: %v", err)
	}
	if cl.Session != nil {
		return s.finishSessionMFALogin(ctx, ws, key, &cl, req)
	}
	if ws.Created.Before(cl.Created) {
		// Left in place: the user logs in on the page and finishes it.
		return nil, trace.WithField(trace.AccessDenied(MsgCLILoginStale), auditReasonField, "web session older than the psh login")
	}
	// The delete is the commit point: one finish per request.
	if err := s.store.Backend().Delete(ctx, key); err != nil {
		if trace.IsNotFound(err) {
			return nil, trace.AccessDenied(MsgCLILoginGone)
		}
		return nil, trace.Wrap(err)
	}
	user, err := s.store.GetUser(ctx, ws.User)
	if err != nil {
		if trace.IsNotFound(err) {
			return nil, trace.AccessDenied("invalid or expired web session")
		}
		return nil, trace.Wrap(err)
	}
	connector := ConnectorLocal
	if user.Connector != "" {
		connector = user.Connector
	}
	// The roles and traits of the user's record: a local user's own, a
	// single sign-on user's from their login (the one that made this web
	// session). The certificate never outlives the session that vouched
	// for it.
	res := &LoginResult{User: user.Name, Connector: connector, Roles: user.Roles, Traits: user.Traits, Expires: ws.Expires}
	login, err := s.completeLogin(ctx, res, LoginOutput{PublicKey: cl.Client.PublicKey, TTL: cl.Client.TTL})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	sealed, err := sealLogin(login, cl.Client.SealKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	s.emitLoginMethod(ctx, events.AuthLogin, user.Name, req.RemoteAddr, methodWebCLI, "")
	s.log.WithField("user", user.Name).Info("Issued a certificate to psh through the web login page.")
	return &authapi.SSOCallbackResponse{Username: user.Name, ClientRedirectURL: cl.Client.RedirectURL, SealedLogin: sealed}, nil
}

func (a *APIServer) createCLILogin(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.SSOClientLogin
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.CreateCLILogin(ctx, req)
	return resp, trace.Wrap(err)
}

func (a *APIServer) finishCLILogin(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.CLILoginFinishRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.FinishCLILogin(ctx, req)
	return resp, trace.Wrap(err)
}

// CreateCLILogin starts a CLI login through the web login page (proxy).
func (c *Client) CreateCLILogin(ctx context.Context, cl authapi.SSOClientLogin) (*authapi.CLILoginResponse, error) {
	return call[authapi.CLILoginResponse](ctx, c, http.MethodPost, "/v1/cli-logins", nil, cl)
}

// FinishCLILogin finishes it with a browser's web session (proxy).
func (c *Client) FinishCLILogin(ctx context.Context, req authapi.CLILoginFinishRequest) (*authapi.SSOCallbackResponse, error) {
	return call[authapi.SSOCallbackResponse](ctx, c, http.MethodPost, "/v1/cli-logins/finish", nil, req)
}

// finishSessionMFALogin finishes a per-session confirmation: the page's
// user is the one psh's certificate named, and the passkey answer is
// fresh (the web session's age does not matter: the passkey is the
// factor), so psh's key gets a per-session certificate, sealed to it.
func (s *Server) finishSessionMFALogin(ctx context.Context, ws *services.WebSession, key string, cl *cliLogin, req authapi.CLILoginFinishRequest) (*authapi.SSOCallbackResponse, error) {
	if ws.User != cl.User {
		return nil, trace.AccessDenied("this psh session belongs to another user: log in on this page as them")
	}
	if err := s.store.Backend().Delete(ctx, key); err != nil {
		if trace.IsNotFound(err) {
			return nil, trace.AccessDenied(MsgCLILoginGone)
		}
		return nil, trace.Wrap(err)
	}
	user, err := s.store.GetUser(ctx, ws.User)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := s.issueSessionCert(ctx, user, authapi.SessionCertRequest{
		PublicKey: cl.Client.PublicKey, Node: cl.Session.Node, Cluster: cl.Session.Cluster, Login: cl.Session.Login,
		ChallengeID: req.ChallengeID, WebAuthn: req.WebAuthn, RemoteAddr: req.RemoteAddr,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	sealed, err := sealLogin(&authapi.SSHLoginResponse{Username: user.Name, Cert: resp.Cert}, cl.Client.SealKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &authapi.SSOCallbackResponse{Username: user.Name, ClientRedirectURL: cl.Client.RedirectURL, SealedLogin: sealed}, nil
}

func (a *APIServer) createSessionMFALogin(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.SessionMFALoginRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.CreateSessionMFALogin(ctx, req)
	return resp, trace.Wrap(err)
}

// CreateSessionMFALogin starts a per-session confirmation in the browser
// (proxy, for psh ssh).
func (c *Client) CreateSessionMFALogin(ctx context.Context, req authapi.SessionMFALoginRequest) (*authapi.CLILoginResponse, error) {
	return call[authapi.CLILoginResponse](ctx, c, http.MethodPost, "/v1/cli-logins/session", nil, req)
}
