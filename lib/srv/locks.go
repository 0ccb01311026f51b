package srv

import (
	"sync"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
)

// Locks are enforced at three points, none of them a backend round trip
// (the LockChecker is an in-memory set kept current by a watch):
//   - authentication: a locked user (or, in node mode, a locked node) is
//     refused with the lock's message as an SSH banner;
//   - every channel open (session, direct-tcpip): refused with the message,
//     so a connection opened before the lock gets nothing new;
//   - every change of the lock set: the server's registry of live
//     connections is swept and the locked ones are ended, after the message
//     is written to their open sessions' stderr.
//
// Deleting a user writes a lock on the name (lib/auth), so a deleted
// user's certificates stop working the same way.

// LockChecker is what the server needs of the cluster's locks;
// *services.LockWatcher is the production one.
type LockChecker interface {
	// Check returns a *services.LockedError for a lock in force on any of
	// targets, a ConnectionProblem while the lock set is not loaded.
	Check(targets ...services.LockTarget) error
	// Changes is closed at the next change of the lock set.
	Changes() <-chan struct{}
}

var _ LockChecker = (*services.LockWatcher)(nil)

// lockOutWait bounds how long ending a locked connection waits for its
// sessions to take the explanation on stderr: a client that stopped
// reading must not keep its connection open by a full window.
const lockOutWait = time.Second

// lockOutProxyGrace is how long the proxy lets a locked connection live
// after the lock before it cuts it, unless the client goes first. The
// node behind an `ssh -J` hop learns of the lock at the same moment and
// writes the reason into the session the user sees, which travels inside
// the proxy's direct-tcpip channel: cutting that channel at once would
// swallow the message. The node has milliseconds; a second also bounds a
// node that does not cooperate.
const lockOutProxyGrace = time.Second

// checkLocks checks the locks on the identity (its user and the access
// request its certificate carries) and, in node mode, on this node.
func (s *Server) checkLocks(id *authz.Identity) error {
	if s.cfg.Locks == nil {
		return nil
	}
	targets := id.LockTargets()
	if s.policy.checkNode {
		targets = append(targets, services.LockTarget{Node: s.cfg.GetNode().UUID})
	}
	return s.cfg.Locks.Check(targets...)
}

// lockRefusal is the one line a refused user reads.
func lockRefusal(err error) string {
	if services.IsLocked(err) {
		return err.Error()
	}
	return "postern: " + trace.UserMessage(err)
}

// enforceLocks ends the connections a new lock covers, at start and at
// every change, until the server closes.
func (s *Server) enforceLocks() {
	defer close(s.locksDone)
	for {
		// Taken before the sweep: a change during it wakes the next one.
		changed := s.cfg.Locks.Changes()
		s.closeLocked()
		select {
		case <-changed:
		case <-s.ctx.Done():
			return
		}
	}
}

// closeLocked ends every live connection that a lock now covers. A lock
// set that is not loaded (or broke and is being re-synced) ends nothing:
// the last good set was applied already.
func (s *Server) closeLocked() {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		err := s.checkLocks(c.auth.id)
		if !services.IsLocked(err) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.lockOut(err)
		}()
	}
	wg.Wait()
}

// lockOut tells the connection's open sessions why on stderr, then ends
// the connection.
func (c *conn) lockOut(err error) {
	msg := lockRefusal(err)
	if !c.ending.CompareAndSwap(false, true) {
		return
	}
	c.log.WithField("reason", msg).Warn("Ending a locked connection.")
	c.endWith(msg)
}

// endWith writes msg to the connection's open sessions' stderr (waiting
// at most lockOutWait for a client that stopped reading), then, after the
// proxy's grace, ends the connection with msg as its cause. The caller
// has won c.ending.
func (c *conn) endWith(msg string) {
	c.tell(msg, c.srv.policy.lockOutGrace)
}

// tellAndClose is endWith without the proxy's grace: the server is going
// away now. The caller has won c.ending.
func (c *conn) tellAndClose(msg string) {
	c.tell(msg, 0)
}

// tell writes msg to the open sessions' stderr, waits grace (if any, or
// until the connection ends), and closes the connection with msg as its
// cause.
func (c *conn) tell(msg string, grace time.Duration) {
	c.mu.Lock()
	sessions := make([]*session, 0, len(c.sessions))
	for s := range c.sessions {
		sessions = append(sessions, s)
	}
	c.mu.Unlock()
	written := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Ends at the latest when close below tears the channel down.
			s.tellStderr("\r\n" + msg + "\r\n")
		}()
	}
	go func() {
		wg.Wait()
		close(written)
	}()
	timer := c.cfg.Clock.NewTimer(lockOutWait)
	select {
	case <-written:
	case <-timer.Chan():
	}
	timer.Stop()
	if grace > 0 {
		t := c.cfg.Clock.NewTimer(grace)
		select {
		case <-t.Chan():
		case <-c.ctx.Done():
		}
		t.Stop()
	}
	c.close(msg)
	<-written
}

// addSession and removeSession keep the registry lockOut writes to.
func (c *conn) addSession(s *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sessions == nil {
		c.sessions = map[*session]struct{}{}
	}
	c.sessions[s] = struct{}{}
}

func (c *conn) removeSession(s *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sessions, s)
}
