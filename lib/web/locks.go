package web

import (
	"context"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// Locks end web sessions the way they end SSH connections: a request of a
// locked (or deleted: deletion writes a lock) user is refused with 401 and
// its session is ended, and every change of the lock set ends the locked
// users' sessions and terminals on this proxy at once, not at their next
// request.

// LockChecker is what the web server needs of the cluster's locks;
// *services.LockWatcher is the production one.
type LockChecker interface {
	Check(targets ...services.LockTarget) error
	Changes() <-chan struct{}
}

var _ LockChecker = (*services.LockWatcher)(nil)

// checkLocks is the lock check of one session: its user and, when the
// session's certificate carries an access request's roles, the request.
// It returns the session to serve: one that assumed a request whose grant
// has ended (a lock on its id: denied, expired) goes on with its own
// roles, its terminals opened with the grant ended; a locked user ends it.
func (s *Server) checkLocks(live *liveSession) (*liveSession, error) {
	locks := s.cfg.WebSessions.Locks
	if locks == nil {
		return live, nil
	}
	if err := locks.Check(services.LockTarget{User: live.user}); err != nil {
		return live, err
	}
	if live.cert == nil {
		return live, nil
	}
	id := live.cert.Permissions.Extensions[services.CertExtensionRequestID]
	if id == "" {
		return live, nil
	}
	err := locks.Check(services.LockTarget{AccessRequest: id})
	if services.IsLocked(err) && live.assumed != nil {
		return s.dropAssumed(live, err), nil
	}
	return live, err
}

// enforceLocks ends locked users' sessions at start and at every change
// of the lock set, until the web state is shut down.
func (w *webState) enforceLocks(s *Server, locks LockChecker) {
	defer close(w.locksDone)
	for {
		changed := locks.Changes()
		for _, live := range w.sessions.all() {
			if _, err := s.checkLocks(live); services.IsLocked(err) {
				s.cfg.Logger.WithField("user", live.user).WithField("reason", err.Error()).Warn("Ending a locked user's web session.")
				s.endSessionCause(w.ctx, live.ref, err)
			}
		}
		// A Postern node ends its own sessions when it is locked; a
		// stock sshd knows nothing of locks, so the proxy ends the
		// terminals it holds to a locked OpenSSH node.
		for t, node := range w.terms.openSSH() {
			if err := locks.Check(services.LockTarget{Node: node}); services.IsLocked(err) {
				t.log.WithField("reason", err.Error()).Warn("Ending a terminal to a locked OpenSSH node.")
				t.cancel(err)
			}
		}
		select {
		case <-changed:
		case <-w.ctx.Done():
			return
		}
	}
}

// endSessionCause is endSession with the reason its terminals show.
func (s *Server) endSessionCause(ctx context.Context, ref SessionRef, cause error) {
	if err := s.cfg.WebSessions.Store.DeleteSession(ctx, ref); err != nil && !trace.IsNotFound(err) {
		s.cfg.Logger.WithError(err).Warn("Could not delete a web session.")
	}
	s.web.sessions.removeCause(ref.Key(), cause)
}

// all returns the live sessions.
func (r *sessionRegistry) all() []*liveSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*liveSession, 0, len(r.byKey))
	for _, s := range r.byKey {
		out = append(out, s)
	}
	return out
}

// removeCause drops a session and ends its terminals with cause.
func (r *sessionRegistry) removeCause(key string, cause error) {
	r.mu.Lock()
	s := r.byKey[key]
	delete(r.byKey, key)
	r.mu.Unlock()
	if s != nil {
		s.cancel(cause)
	}
}

// lockRefusal is the line a refused browser or client reads.
func lockRefusal(err error) string {
	if services.IsLocked(err) {
		return err.Error()
	}
	return "postern: " + trace.UserMessage(err)
}
