package service

import (
	"context"
	"sync"

	"github.com/gravitational/trace"
)

// drainFrontends shuts the proxy's client-facing servers (SSH and web)
// down together: each closes its listeners at once and then waits for its
// sessions, so that on SIGTERM no port keeps accepting while another one
// drains (one after the other, the SSH port would accept new sessions for
// as long as a web terminal stayed open). The wait is bounded by ctx,
// the shutdown_grace; past it the remaining sessions are closed.
//
// It runs after this proxy's record is removed (so load balancers and
// agents stop sending new work here) and before the tunnel and peer
// servers close: tunnels and peered dials served from them stay up while
// the sessions that use them drain.
func (p *Process) drainFrontends(ctx context.Context) error {
	drainers := p.drainers
	p.drainers = nil
	errs := make([]error, len(drainers))
	var wg sync.WaitGroup
	for i, d := range drainers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d(ctx)
		}()
	}
	wg.Wait()
	return trace.NewAggregate(errs...)
}
