package auth

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// Locks are written here (admins over the API, and DeleteUser) and read by
// every proxy and node through a LockWatcher: from the backend when auth
// runs in the same process, through GET /v1/locks and the /v1/watch/locks
// stream otherwise.

// maxLockTTL bounds --ttl: longer than that is a lock without expiry
// spelled in a way nobody will remember to look at.
const maxLockTTL = 365 * 24 * time.Hour

// DeletedUserLockTTL is how long the lock that deleting a user writes
// lasts: longer than any certificate issued before the deletion (the
// roles cap certificates at services.DefaultMaxSessionTTL and may only
// lower it, web sessions never outlive their certificate), plus the
// back-dating of ValidAfter. After that nothing the user held still works,
// and the lock lifts itself.
const DeletedUserLockTTL = services.DefaultMaxSessionTTL + clockSkew

// UpsertLock locks req.Target; by names who asked (the admin's identity).
func (s *Server) UpsertLock(ctx context.Context, req authapi.LockRequest, by string) (*services.Lock, error) {
	ttl := req.TTL.Value()
	if ttl < 0 || ttl > maxLockTTL {
		return nil, trace.BadParameter("lock ttl %v: want a positive duration up to %v, or none", ttl, maxLockTTL)
	}
	now := s.clock.Now().UTC()
	l := services.Lock{Target: req.Target, Message: req.Message, CreatedBy: by, Created: now}
	if ttl > 0 {
		l.Expires = now.Add(ttl)
	}
	if err := s.store.UpsertLock(ctx, l); err != nil {
		return nil, trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"target": l.Target.String(), "by": by, "expires": l.Expires}).Info("Lock written.")
	return &l, nil
}

// DeleteLock lifts the lock on t.
func (s *Server) DeleteLock(ctx context.Context, t services.LockTarget) error {
	if err := t.Check(); err != nil {
		return trace.Wrap(err)
	}
	if err := s.store.DeleteLock(ctx, t); err != nil {
		return trace.Wrap(err)
	}
	s.log.WithField("target", t.String()).Info("Lock lifted.")
	return nil
}

// lockDeletedUser writes the lock that makes a deletion cut access at once:
// certificates and web sessions of the user are still valid for hours, and
// every proxy and node already enforces locks on open connections.
func (s *Server) lockDeletedUser(ctx context.Context, name string) error {
	now := s.clock.Now().UTC()
	err := s.store.UpsertLock(ctx, services.Lock{
		Target:    services.LockTarget{User: name},
		Message:   "the user was deleted",
		CreatedBy: RoleAuth,
		Created:   now,
		Expires:   now.Add(DeletedUserLockTTL),
	})
	return trace.Wrap(err, "locking deleted user %q", name)
}

// checkUserLock refuses a certificate to a locked user: a lock must not be
// undone by logging in again.
func (s *Server) checkUserLock(ctx context.Context, name string) error {
	l, err := s.store.GetLock(ctx, services.LockTarget{User: name})
	if trace.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return trace.Wrap(err)
	}
	if l.IsExpired(s.clock.Now()) {
		return nil
	}
	return trace.Wrap(services.LockDenied(l.Refusal()))
}

func (a *APIServer) upsertLock(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.LockRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	l, err := a.auth.UpsertLock(ctx, req, p.Role+":"+p.ID)
	return l, trace.Wrap(err)
}

func (a *APIServer) deleteLock(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	t, err := services.ParseLockTarget(r.PathValue("kind"), r.PathValue("name"))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.DeleteLock(ctx, t))
}

func (a *APIServer) getLocks(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	locks, err := a.auth.store.GetLocks(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if locks == nil {
		locks = []services.Lock{}
	}
	return locks, nil
}

// watchLocks streams lock events, like watchNodes streams nodes.
func (a *APIServer) watchLocks(w http.ResponseWriter, r *http.Request, p *peer) {
	a.watchPrefix(w, r, p, services.LocksPrefix())
}

// UpsertLock locks a user or a node (admin only).
func (c *Client) UpsertLock(ctx context.Context, req authapi.LockRequest) (*services.Lock, error) {
	return call[services.Lock](ctx, c, http.MethodPut, "/v1/locks", nil, req)
}

// DeleteLock lifts a lock (admin only).
func (c *Client) DeleteLock(ctx context.Context, t services.LockTarget) error {
	if err := t.Check(); err != nil {
		return trace.Wrap(err)
	}
	kind, name := services.LockTargetUser, t.User
	switch {
	case t.Node != "":
		kind, name = services.LockTargetNode, t.Node
	case t.AccessRequest != "":
		kind, name = services.LockTargetAccessRequest, t.AccessRequest
	}
	return trace.Wrap(c.do(ctx, http.MethodDelete, "/v1/locks/"+url.PathEscape(kind)+"/"+url.PathEscape(name), nil, nil, nil))
}

// GetLocks lists the locks in force.
func (c *Client) GetLocks(ctx context.Context) ([]services.Lock, error) {
	var locks []services.Lock
	return locks, trace.Wrap(c.do(ctx, http.MethodGet, "/v1/locks", nil, nil, &locks))
}

// LockEvents is the auth server's lock list and lock watch, for the
// LockWatcher of a proxy or node whose auth server is elsewhere.
func (c *Client) LockEvents() services.LockEvents { return lockEvents{c} }

type lockEvents struct{ c *Client }

func (l lockEvents) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	return l.c.newWatcher(ctx, "/v1/watch/locks", watch)
}

func (l lockEvents) GetLocks(ctx context.Context) ([]services.Lock, error) {
	return l.c.GetLocks(ctx)
}
