package web

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// Web sessions shared by every proxy: the record (hashes, user, expiries)
// lives in the backend, reached through auth; each proxy holds its own key
// and certificate for the session's user in memory. A proxy shown a
// session it has no key for (the browser logged in through another proxy,
// or before this proxy restarted) makes a key and asks auth to certify it
// with the session's two secrets (adoptSession). Every proxy watches the
// ends of records: a logout, an expiry or a lock's delete on any proxy
// ends the session's terminals on all of them (watchSessions), within the
// watch's latency. The watch names an end by services.WebSessionEndID of
// the key only, which this proxy matches against the sessions it serves.
// Every other call names the session by the secrets its browser presented
// (SessionRef), so a proxy cannot act on a session it was not shown.

// WebSessionCertifier certifies a proxy's key for the user of a web
// session: *auth.Server in the auth process, *auth.Client elsewhere.
type WebSessionCertifier interface {
	WebSessionCerts(ctx context.Context, req authapi.WebSessionCertRequest) (*authapi.SSHLoginResponse, error)
}

var (
	_ WebSessionCertifier = (*auth.Server)(nil)
	_ WebSessionCertifier = (*auth.Client)(nil)
)

// SessionWatch starts a watch of the ends of session records: OpInit,
// then an OpDelete per ended session, its key services.WebSessionEndID
// of the record's key under services.WebSessionsPrefix
// (auth.Server.WebSessionEvents).
type SessionWatch func(ctx context.Context) (backend.Watcher, error)

// authSessionAPI is the auth API's web-session calls.
type authSessionAPI interface {
	GetWebSession(ctx context.Context, sid, token string) (*services.WebSession, error)
	TouchWebSession(ctx context.Context, sid, token string, at time.Time) error
	DeleteWebSession(ctx context.Context, sid, token string) error
}

// AuthSessionStore keeps records through the auth API, for a proxy whose
// auth server runs elsewhere. Records are created by auth as part of the
// login (createdAtLogin), never by the proxy: the API has no call that
// makes a session for a user without that user's password. Updates only
// move LastActive forward.
type AuthSessionStore struct {
	Auth authSessionAPI
}

var _ SessionStore = (*AuthSessionStore)(nil)

// createdAtLogin tells createSession to ask auth for the record in the
// login call.
func (a *AuthSessionStore) createdAtLogin() bool { return true }

// CreateSession is refused: auth creates records at login.
func (a *AuthSessionStore) CreateSession(context.Context, SessionRef, SessionRecord) error {
	return trace.BadParameter("web sessions are created by auth at login")
}

// GetSession reads a record.
func (a *AuthSessionStore) GetSession(ctx context.Context, ref SessionRef) (*SessionRecord, error) {
	ws, err := a.Auth.GetWebSession(ctx, ref.ID, ref.Token)
	if trace.IsAccessDenied(err) {
		// A token that does not match the id: for the browser, no
		// session (auth has audited it).
		return nil, trace.NotFound("web session not found")
	}
	return ws, trace.Wrap(err)
}

// UpdateSession records rec.LastActive; nothing else can change.
func (a *AuthSessionStore) UpdateSession(ctx context.Context, ref SessionRef, rec SessionRecord) error {
	return trace.Wrap(a.Auth.TouchWebSession(ctx, ref.ID, ref.Token, rec.LastActive))
}

// DeleteSession ends the session on every proxy.
func (a *AuthSessionStore) DeleteSession(ctx context.Context, ref SessionRef) error {
	return trace.Wrap(a.Auth.DeleteWebSession(ctx, ref.ID, ref.Token))
}

// sessionsCreatedAtLogin reports whether store wants auth to create the
// record in the login call.
func sessionsCreatedAtLogin(store SessionStore) bool {
	s, ok := store.(interface{ createdAtLogin() bool })
	return ok && s.createdAtLogin()
}

// adoptSession gives this proxy its own key for a session created
// elsewhere. Two requests of one browser may race here; the first to
// register wins and the other's key is dropped.
func (s *Server) adoptSession(ctx context.Context, ref SessionRef, rec *SessionRecord) (*liveSession, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := s.cfg.WebSessions.Certs.WebSessionCerts(ctx, authapi.WebSessionCertRequest{
		SessionID: ref.ID, Token: ref.Token, PublicKey: ssh.MarshalAuthorizedKey(sshPub),
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	live, err := newLiveSession(priv, resp, s.cfg.ClusterName)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if live.user != rec.User {
		// Auth certifies the record's user; anything else is a bug or a
		// record swapped in between: never serve it.
		return nil, trace.AccessDenied("web session user mismatch")
	}
	live.setRef(ref)
	live.expires = rec.Expires
	if certEnd := time.Unix(int64(live.cert.ValidBefore), 0); certEnd.Before(live.expires) {
		live.expires = certEnd
	}
	live.ctx, live.cancel = context.WithCancelCause(s.web.ctx)
	if got := s.web.sessions.addIfAbsent(live); got != live {
		live.cancel(errLoggedOut)
		return got, nil
	}
	s.cfg.Logger.WithField("user", live.user).Info("Serving a web session created on another proxy.")
	return live, nil
}

// addIfAbsent registers s unless the key already has a session, and
// returns the registered one.
func (r *sessionRegistry) addIfAbsent(s *liveSession) *liveSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey = map[string]*liveSession{}
	}
	if have, ok := r.byKey[s.key]; ok {
		return have
	}
	r.byKey[s.key] = s
	return s
}

// Bounds of the session watch's retry after it broke. The top is how late
// a logout made elsewhere during a backend outage ends this proxy's
// terminals once the backend is back: 1 s, as for the resource watchers
// (services.DefaultMaxBackoff), so that a proxy is current again within
// 2 s of the backend's return.
const (
	sessionWatchMinBackoff = 500 * time.Millisecond
	sessionWatchMaxBackoff = time.Second
)

// watchSessions ends this proxy's live sessions whose records are
// deleted anywhere, until the web state shuts down. After a broken watch
// it re-syncs: every live session whose record is gone is ended.
func (w *webState) watchSessions(s *Server, watch SessionWatch) {
	defer close(w.watchDone)
	log := s.cfg.Logger.WithField("watch", "web sessions")
	backoff := sessionWatchMinBackoff
	for {
		healthy, err := w.followSessions(s, watch)
		if w.ctx.Err() != nil {
			return
		}
		if healthy {
			backoff = sessionWatchMinBackoff
		}
		log.WithError(err).Warn("The web session watch broke; retrying. Logouts on other proxies reach this one when it is back.")
		select {
		case <-s.cfg.Clock.After(backoff):
		case <-w.ctx.Done():
			return
		}
		backoff = min(backoff*2, sessionWatchMaxBackoff)
	}
}

// followSessions runs one watch; healthy reports whether it got as far as
// its initial event.
func (w *webState) followSessions(s *Server, watch SessionWatch) (healthy bool, err error) {
	watcher, err := watch(w.ctx)
	if err != nil {
		return false, trace.Wrap(err)
	}
	defer watcher.Close()
	for {
		select {
		case ev := <-watcher.Events():
			switch ev.Type {
			case backend.OpInit:
				healthy = true
				w.resyncSessions(s)
			case backend.OpDelete:
				endID := strings.TrimPrefix(ev.Item.Key, services.WebSessionsPrefix())
				if live := w.sessions.byEndID(endID); live != nil {
					s.cfg.Logger.Debug("A web session ended on another proxy (or expired); ending it here.")
					w.sessions.remove(live.key)
				}
			}
		case <-watcher.Done():
			return healthy, trace.Wrap(watcher.Error())
		case <-w.ctx.Done():
			return healthy, nil
		}
	}
}

// resyncSessions ends the live sessions whose records are gone: deletes
// that happened while the watch was down.
func (w *webState) resyncSessions(s *Server) {
	for _, live := range w.sessions.all() {
		_, err := s.cfg.WebSessions.Store.GetSession(w.ctx, live.ref)
		if trace.IsNotFound(err) {
			w.sessions.remove(live.key)
		}
	}
}
