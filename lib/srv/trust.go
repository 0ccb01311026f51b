package srv

import (
	"context"
	"fmt"
	"sync"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// A root cluster's users are accepted on a leaf only while an enabled
// trusted_cluster names the root and the leaf holds the root's user CA
// that signed them. Authentication and every channel open check that,
// but a shell already running needs neither again: without a sweep, a
// root user's shell would outlive `pctl rm trusted_cluster/ROOT` on the
// leaf for as long as the user kept it open. So, like locks (locks.go),
// every change of the trusted clusters or CAs sweeps the live
// connections of other clusters' users and ends those no longer trusted,
// after writing why to their open sessions' stderr, and audits it
// (conn.terminated).

// TrustWatcher is an AccessPoint that announces changes of the CAs and
// trusted clusters; *services.AccessCache is one. With an AccessPoint
// that does not, open connections of a root's users are not swept.
type TrustWatcher interface {
	AccessPoint
	// TrustChanges is closed at the next change of the CAs or the
	// trusted clusters.
	TrustChanges() <-chan struct{}
}

var _ TrustWatcher = (*services.AccessCache)(nil)

// enforceTrust ends the connections of users whose cluster is no longer
// trusted, at start and at every change, until the server closes.
func (s *Server) enforceTrust(tw TrustWatcher) {
	defer close(s.trustDone)
	for {
		// Taken before the sweep: a change during it wakes the next one.
		changed := tw.TrustChanges()
		s.closeUntrusted()
		select {
		case <-changed:
		case <-s.ctx.Done():
			return
		}
	}
}

// closeUntrusted ends every live connection of another cluster's user
// that this cluster no longer trusts. An access point that cannot answer
// (its watch broken) ends nothing: the next change sweeps again.
func (s *Server) closeUntrusted() {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		if c.auth != nil && c.auth.signedBy != nil && !c.ending.Load() {
			conns = append(conns, c)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		reason, err := s.untrustedReason(c)
		if err != nil {
			c.log.WithError(err).Warn("Cannot re-check the trust of a root cluster's user; the connection stays until the next change.")
			continue
		}
		if reason == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !c.ending.CompareAndSwap(false, true) {
				return
			}
			c.log.WithField("reason", reason).Warn("Ending a connection of a user whose cluster is no longer trusted.")
			// Audited first: the event must not wait for a client
			// that stopped reading.
			c.emit(events.ConnTerminated, events.Fields{events.FieldKind: "trust", events.FieldReason: reason})
			c.endWith("postern: " + reason + "; connection closed")
		}()
	}
	wg.Wait()
}

// untrustedReason is why c's certificate is no longer trusted here, ""
// while it still is.
func (s *Server) untrustedReason(c *conn) (string, error) {
	ctx, cancel := context.WithTimeout(s.ctx, accessPointTimeout)
	defer cancel()
	cluster := c.auth.id.Cluster
	tc, err := s.cfg.AccessPoint.GetTrustedCluster(ctx, cluster)
	switch {
	case trace.IsNotFound(err):
		return fmt.Sprintf("cluster %q is no longer trusted here (its trusted_cluster was removed)", cluster), nil
	case err != nil:
		return "", trace.Wrap(err)
	case !tc.Spec.Enabled:
		return fmt.Sprintf("cluster %q is no longer trusted here (its trusted_cluster was disabled)", cluster), nil
	}
	ca, err := s.cfg.AccessPoint.GetCertAuthority(ctx, cluster, services.UserCA, false)
	switch {
	case trace.IsNotFound(err):
		return fmt.Sprintf("the user CA of cluster %q is no longer held here", cluster), nil
	case err != nil:
		return "", trace.Wrap(err)
	case !isUserAuthority(ca, c.auth.signedBy):
		return fmt.Sprintf("the user CA key of cluster %q that signed this certificate is no longer trusted here", cluster), nil
	}
	return "", nil
}
