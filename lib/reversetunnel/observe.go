package reversetunnel

import "sort"

// What the tunnel_connection leases need (lib/proxy/peer.LeaseKeeper):
// the set of nodes with a tunnel here, and a signal when it changes, so
// that a new tunnel is announced to the other proxies at once rather
// than at the next renewal.

// TunnelUUIDs lists the nodes with at least one tunnel here, sorted.
func (s *Server) TunnelUUIDs() []string {
	s.mu.Lock()
	out := make([]string, 0, len(s.byUUID))
	for uuid := range s.byUUID {
		out = append(out, uuid)
	}
	s.mu.Unlock()
	sort.Strings(out)
	return out
}

// Changed returns a channel closed when a tunnel next registers or
// disconnects. Callers read TunnelUUIDs after taking it.
func (s *Server) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

func (s *Server) changedLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}
