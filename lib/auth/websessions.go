package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// Web sessions in the backend, served to every proxy through this API so
// that any proxy serves any browser (lib/web/sessionauth.go has the
// browser's side). The rules that keep a proxy from turning the API into
// certificates for anyone:
//
//   - A session record is created only by a login (AuthenticateSSHUser
//     with WebSession set), bound to the user the password proved; no
//     endpoint creates one otherwise or changes its user or token hash.
//   - A certificate for a session's user (WebSessionCerts) needs both
//     secrets of the session, the cookie's session id and the bearer
//     token, which only the browser holds; the backend and the API keep
//     and return only their hashes. The certificate expires with the
//     session and goes through the same lock and role checks as a login.
//   - Logout (DeleteWebSession) removes the record; every proxy watches
//     the prefix (/v1/watch/websessions) and ends the session's terminals.

// webSessionKeyOf is the store key of a session id.
func webSessionKeyOf(sessionID string) string {
	h := sha256.Sum256([]byte(sessionID))
	return hex.EncodeToString(h[:])
}

// createWebSession stores the session a login asked for, expiring with
// the certificate just issued.
func (s *Server) createWebSession(ctx context.Context, user string, init *authapi.WebSessionInit, cert []byte) error {
	if err := services.CheckWebSessionKey(init.Key); err != nil {
		return trace.Wrap(err)
	}
	if len(init.TokenHash) != sha256.Size {
		return trace.BadParameter("web session token hash must be a SHA-256")
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(cert)
	if err != nil {
		return trace.Wrap(err)
	}
	c, ok := pub.(*ssh.Certificate)
	if !ok {
		return trace.BadParameter("login issued no certificate")
	}
	now := s.clock.Now()
	ws := services.WebSession{
		User: user, TokenHash: init.TokenHash, Created: now, LastActive: now,
		Expires: time.Unix(int64(c.ValidBefore), 0),
	}
	return trace.Wrap(s.store.CreateWebSession(ctx, init.Key, ws))
}

// GetWebSession returns a web session record (hashes only).
func (s *Server) GetWebSession(ctx context.Context, key string) (*services.WebSession, error) {
	ws, err := s.store.GetWebSession(ctx, key)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if !s.clock.Now().Before(ws.Expires) {
		return nil, trace.NotFound("web session not found")
	}
	return ws, nil
}

// TouchWebSession records use of a session; a time in the future is
// capped at now (a proxy cannot keep a session alive in advance).
func (s *Server) TouchWebSession(ctx context.Context, key string, at time.Time) error {
	if now := s.clock.Now(); at.After(now) {
		at = now
	}
	return trace.Wrap(s.store.TouchWebSession(ctx, key, at))
}

// DeleteWebSession ends a session everywhere.
func (s *Server) DeleteWebSession(ctx context.Context, key string) error {
	return trace.Wrap(s.store.DeleteWebSession(ctx, key))
}

// WebSessionCerts certifies a proxy's key for the user of a session that
// the caller proves it was shown, by both its secrets. Every failure is
// the same AccessDenied: the caller learns nothing about which part was
// wrong.
func (s *Server) WebSessionCerts(ctx context.Context, req authapi.WebSessionCertRequest) (*authapi.SSHLoginResponse, error) {
	denied := trace.AccessDenied("invalid or expired web session")
	if req.SessionID == "" || req.Token == "" {
		return nil, denied
	}
	ws, err := s.store.GetWebSession(ctx, webSessionKeyOf(req.SessionID))
	if err != nil {
		if trace.IsNotFound(err) {
			return nil, denied
		}
		return nil, trace.Wrap(err)
	}
	th := sha256.Sum256([]byte(req.Token))
	if subtle.ConstantTimeCompare(ws.TokenHash, th[:]) != 1 {
		return nil, denied
	}
	ttl := ws.Expires.Sub(s.clock.Now())
	if ttl < time.Second {
		return nil, denied
	}
	user, err := s.store.GetUser(ctx, ws.User)
	if err != nil {
		if trace.IsNotFound(err) {
			return nil, denied
		}
		return nil, trace.Wrap(err)
	}
	cert, err := s.generateUserCert(ctx, user, authapi.UserCertRequest{User: user.Name, PublicKey: req.PublicKey, TTL: ttl})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	s.log.WithField("user", user.Name).Debug("Certified a proxy's key for a web session created elsewhere.")
	signers, err := s.hostSigners(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &authapi.SSHLoginResponse{
		Username:    user.Name,
		Cert:        cert,
		HostSigners: signers,
	}, nil
}

// WebSessionEvents watches the sessions prefix of the local backend.
func (s *Server) WebSessionEvents(ctx context.Context) (backend.Watcher, error) {
	return s.store.Backend().NewWatcher(ctx, backend.Watch{Name: "web sessions", Prefixes: []string{services.WebSessionsPrefix()}})
}

// API handlers (the table is in apihandlers.go).

func (a *APIServer) getWebSession(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	ws, err := a.auth.GetWebSession(ctx, r.PathValue("key"))
	return ws, trace.Wrap(err)
}

func (a *APIServer) touchWebSession(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.WebSessionTouchRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.TouchWebSession(ctx, r.PathValue("key"), req.LastActive))
}

func (a *APIServer) deleteWebSession(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.DeleteWebSession(ctx, r.PathValue("key")))
}

func (a *APIServer) webSessionCerts(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.WebSessionCertRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.WebSessionCerts(ctx, req)
	return resp, trace.Wrap(err)
}

// watchWebSessions streams the keys of sessions as they are created,
// touched and deleted, without their values: a proxy needs to know which
// session ended, not the hashes of every session.
func (a *APIServer) watchWebSessions(w http.ResponseWriter, r *http.Request, p *peer) {
	a.watchRoots(w, r, p, func(string, []byte) ([]byte, error) { return []byte{}, nil }, services.WebSessionsPrefix())
}

// Client side.

// GetWebSession reads a web session record (proxy).
func (c *Client) GetWebSession(ctx context.Context, key string) (*services.WebSession, error) {
	if err := services.CheckWebSessionKey(key); err != nil {
		return nil, trace.NotFound("web session not found")
	}
	return call[services.WebSession](ctx, c, http.MethodGet, "/v1/websessions/"+key, nil, nil)
}

// TouchWebSession records use of a session (proxy).
func (c *Client) TouchWebSession(ctx context.Context, key string, at time.Time) error {
	if err := services.CheckWebSessionKey(key); err != nil {
		return trace.NotFound("web session not found")
	}
	return trace.Wrap(c.do(ctx, http.MethodPost, "/v1/websessions/"+key+"/touch", nil, authapi.WebSessionTouchRequest{LastActive: at}, nil))
}

// DeleteWebSession ends a session everywhere (proxy).
func (c *Client) DeleteWebSession(ctx context.Context, key string) error {
	if err := services.CheckWebSessionKey(key); err != nil {
		return trace.NotFound("web session not found")
	}
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/websessions/"+key, nil, nil, nil))
}

// WebSessionCerts asks for a certificate for a web session's user
// (proxy).
func (c *Client) WebSessionCerts(ctx context.Context, req authapi.WebSessionCertRequest) (*authapi.SSHLoginResponse, error) {
	return call[authapi.SSHLoginResponse](ctx, c, http.MethodPost, "/v1/websessions/certs", nil, req)
}

// WebSessionEvents watches web session keys (proxy); values are empty.
func (c *Client) WebSessionEvents(ctx context.Context) (backend.Watcher, error) {
	return c.newWatcher(ctx, "/v1/watch/websessions", backend.Watch{Name: "web sessions", Prefixes: []string{services.WebSessionsPrefix()}})
}
