package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
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
//   - Reading, touching or deleting a record also needs both secrets
//     (webSessionBySecret): the store key is derived here from the
//     session id, so a key seen in a log, a backend dump or an earlier
//     answer acts on nothing, and no endpoint lists records or streams
//     their keys. A proxy thus acts only on sessions a browser presented
//     to it; the by-key routes stay in the table refused to every role,
//     so that a call by key is audited (api.denied), not a silent 404.
//   - Logout (DeleteWebSession) removes the record; every proxy watches
//     for ends (/v1/watch/websessions/ended), which name a session by
//     services.WebSessionEndID of its key only: a proxy matches the ends
//     of the sessions it serves and learns nothing it could act on.

// webSessionKeyOf is the store key of a session id.
func webSessionKeyOf(sessionID string) string {
	h := sha256.Sum256([]byte(sessionID))
	return hex.EncodeToString(h[:])
}

// createWebSession stores the session a login asked for, expiring with
// the certificate just issued.
func (s *Server) createWebSession(ctx context.Context, user string, init *authapi.WebSessionInit, cert []byte) error {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(cert)
	if err != nil {
		return trace.Wrap(err)
	}
	c, ok := pub.(*ssh.Certificate)
	if !ok {
		return trace.BadParameter("login issued no certificate")
	}
	return trace.Wrap(s.createWebSessionRecord(ctx, user, init, time.Unix(int64(c.ValidBefore), 0), false))
}

// createWebSessionRecord stores a new session's record (hashes only).
func (s *Server) createWebSessionRecord(ctx context.Context, user string, init *authapi.WebSessionInit, expires time.Time, registerOnly bool) error {
	if err := services.CheckWebSessionKey(init.Key); err != nil {
		return trace.Wrap(err)
	}
	if len(init.TokenHash) != sha256.Size {
		return trace.BadParameter("web session token hash must be a SHA-256")
	}
	now := s.clock.Now()
	ws := services.WebSession{
		User: user, TokenHash: init.TokenHash, Created: now, LastActive: now,
		Expires: expires, RegisterOnly: registerOnly,
	}
	return trace.Wrap(s.store.CreateWebSession(ctx, init.Key, ws))
}

// errNoWebSession is the answer to a session id that names no live
// record; a wrong token for a record that exists is errWebSessionToken.
var (
	errNoWebSession    = trace.NotFound("web session not found")
	errWebSessionToken = trace.AccessDenied("web session token does not match")
)

// webSessionBySecret returns the store key and the record of the session
// whose id and token a browser presented: NotFound for an id that names
// no live record, AccessDenied for a wrong token (never legitimate: the
// browser holds both, so the caller guessed or replays a half).
func (s *Server) webSessionBySecret(ctx context.Context, sid, token string) (string, *services.WebSession, error) {
	if sid == "" || token == "" {
		return "", nil, trace.BadParameter("a web session is named by its session_id and token")
	}
	key := webSessionKeyOf(sid)
	ws, err := s.store.GetWebSession(ctx, key)
	if err != nil {
		if trace.IsNotFound(err) {
			return "", nil, errNoWebSession
		}
		return "", nil, trace.Wrap(err)
	}
	th := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(ws.TokenHash, th[:]) != 1 {
		return "", nil, errWebSessionToken
	}
	if !s.clock.Now().Before(ws.Expires) {
		return "", nil, errNoWebSession
	}
	return key, ws, nil
}

// GetWebSession returns the record (hashes only) of the session with
// these secrets.
func (s *Server) GetWebSession(ctx context.Context, sid, token string) (*services.WebSession, error) {
	_, ws, err := s.webSessionBySecret(ctx, sid, token)
	return ws, trace.Wrap(err)
}

// TouchWebSession records use of a session; a time in the future is
// capped at now (a proxy cannot keep a session alive in advance).
func (s *Server) TouchWebSession(ctx context.Context, sid, token string, at time.Time) error {
	key, _, err := s.webSessionBySecret(ctx, sid, token)
	if err != nil {
		return trace.Wrap(err)
	}
	if now := s.clock.Now(); at.After(now) {
		at = now
	}
	return trace.Wrap(s.store.TouchWebSession(ctx, key, at))
}

// DeleteWebSession ends a session everywhere.
func (s *Server) DeleteWebSession(ctx context.Context, sid, token string) error {
	key, _, err := s.webSessionBySecret(ctx, sid, token)
	if err != nil {
		return trace.Wrap(err)
	}
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
	if ws.RegisterOnly {
		// Its user proved a password only: nothing is certified for it.
		s.log.WithField("user", ws.User).Warn("Refused to certify a key for a register-only web session.")
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

// WebSessionEvents watches the ends of web sessions in the local
// backend: OpInit, then an OpDelete per session deleted or expired, its
// key services.WebSessionEndID of the record's key under the sessions
// prefix. Creations and touches are not sent.
func (s *Server) WebSessionEvents(ctx context.Context) (backend.Watcher, error) {
	w, err := s.store.Backend().NewWatcher(ctx, backend.Watch{Name: "web session ends", Prefixes: []string{services.WebSessionsPrefix()}})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return newEndsWatcher(w), nil
}

// webSessionEnd is what a session watch says of a backend event: OpInit
// as is, a delete under its end id, nothing of a put.
func webSessionEnd(ev backend.Event) (backend.Event, bool) {
	switch ev.Type {
	case backend.OpInit:
		return ev, true
	case backend.OpDelete:
		key := strings.TrimPrefix(ev.Item.Key, services.WebSessionsPrefix())
		return backend.Event{Type: backend.OpDelete, Item: backend.Item{
			Key: services.WebSessionsPrefix() + services.WebSessionEndID(key), Revision: ev.Item.Revision,
		}}, true
	}
	return backend.Event{}, false
}

// endsWatcher is a backend watcher seen through webSessionEnd.
type endsWatcher struct {
	backend.Watcher
	events chan backend.Event
	// stopped ends the copy loop (Close).
	stopped   chan struct{}
	closeOnce sync.Once
}

func newEndsWatcher(w backend.Watcher) *endsWatcher {
	e := &endsWatcher{Watcher: w, events: make(chan backend.Event), stopped: make(chan struct{})}
	go e.copy()
	return e
}

func (e *endsWatcher) copy() {
	for {
		select {
		case ev := <-e.Watcher.Events():
			out, ok := webSessionEnd(ev)
			if !ok {
				continue
			}
			select {
			case e.events <- out:
			case <-e.stopped:
				return
			}
		case <-e.Watcher.Done():
			return
		case <-e.stopped:
			return
		}
	}
}

func (e *endsWatcher) Events() <-chan backend.Event { return e.events }

func (e *endsWatcher) Close() error {
	e.closeOnce.Do(func() { close(e.stopped) })
	return trace.Wrap(e.Watcher.Close())
}

// API handlers (the table is in apihandlers.go).

func (a *APIServer) getWebSession(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.WebSessionRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	ws, err := a.auth.GetWebSession(ctx, req.SessionID, req.Token)
	return ws, trace.Wrap(err)
}

func (a *APIServer) touchWebSession(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.WebSessionRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.TouchWebSession(ctx, req.SessionID, req.Token, req.LastActive))
}

func (a *APIServer) deleteWebSession(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.WebSessionRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.DeleteWebSession(ctx, req.SessionID, req.Token))
}

// refuseByKey answers the retired by-key web session routes, which the
// table allows to no role: handle has refused and audited the call
// before this could run.
func (a *APIServer) refuseByKey(context.Context, *peer, *http.Request) (any, error) {
	return nil, trace.AccessDenied("web sessions are named by their secrets, not their keys")
}

func (a *APIServer) webSessionCerts(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	var req authapi.WebSessionCertRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.WebSessionCerts(ctx, req)
	return resp, trace.Wrap(err)
}

// watchWebSessionEnds streams the ends of web sessions under their end
// ids (webSessionEnd): no key, no record, nothing of a session's
// creation or use.
func (a *APIServer) watchWebSessionEnds(w http.ResponseWriter, r *http.Request, p *peer) {
	a.watchEvents(w, r, p, webSessionEnd, services.WebSessionsPrefix())
}

// Client side.

// GetWebSession reads the record of the session with these secrets
// (proxy).
func (c *Client) GetWebSession(ctx context.Context, sid, token string) (*services.WebSession, error) {
	return call[services.WebSession](ctx, c, http.MethodPost, "/v1/websessions/get", nil, authapi.WebSessionRequest{SessionID: sid, Token: token})
}

// TouchWebSession records use of a session (proxy).
func (c *Client) TouchWebSession(ctx context.Context, sid, token string, at time.Time) error {
	return trace.Wrap(c.do(ctx, http.MethodPost, "/v1/websessions/touch", nil, authapi.WebSessionRequest{SessionID: sid, Token: token, LastActive: at}, nil))
}

// DeleteWebSession ends a session everywhere (proxy).
func (c *Client) DeleteWebSession(ctx context.Context, sid, token string) error {
	return trace.Wrap(c.do(ctx, http.MethodPost, "/v1/websessions/delete", nil, authapi.WebSessionRequest{SessionID: sid, Token: token}, nil))
}

// WebSessionCerts asks for a certificate for a web session's user
// (proxy).
func (c *Client) WebSessionCerts(ctx context.Context, req authapi.WebSessionCertRequest) (*authapi.SSHLoginResponse, error) {
	return call[authapi.SSHLoginResponse](ctx, c, http.MethodPost, "/v1/websessions/certs", nil, req)
}

// WebSessionEvents watches the ends of web sessions (proxy), as
// Server.WebSessionEvents delivers them.
func (c *Client) WebSessionEvents(ctx context.Context) (backend.Watcher, error) {
	return c.newWatcher(ctx, "/v1/watch/websessions/ended", backend.Watch{Name: "web session ends", Prefixes: []string{services.WebSessionsPrefix()}})
}
