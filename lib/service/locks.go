package service

import (
	"context"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// lockSyncWait bounds how long start-up waits for the first load of the
// lock set. Until it is loaded every server refuses everyone (deny by
// default); waiting here keeps a healthy start from refusing its first
// connections, and a slow auth server does not stop the process from
// coming up (it keeps retrying in the background).
const lockSyncWait = 10 * time.Second

// startLocks starts the process's one LockWatcher: on the backend when
// auth runs here, through the auth API otherwise. The node's SSH server,
// the proxy's SSH server, its Router and its web sessions all enforce it.
func (p *Process) startLocks(ctx context.Context) error {
	var events services.LockEvents
	switch {
	case p.store != nil:
		events = p.store
	case p.authClient != nil:
		events = p.authClient.LockEvents()
	default:
		return trace.BadParameter("no auth server to read locks from")
	}
	w, err := services.NewLockWatcher(services.LockWatcherConfig{
		Events: events,
		Clock:  p.clock,
		Logger: p.log.WithField("component", "watcher:locks"),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.locks = w
	p.onShutdown(func(context.Context) error { return w.Close() })
	wctx, cancel := context.WithTimeout(ctx, lockSyncWait)
	defer cancel()
	if err := w.WaitSynced(wctx); err != nil {
		p.log.WithError(err).Warn("The lock list is not loaded yet: connections are refused until it is.")
	}
	return nil
}

// tunnelNodeStaleGrace is how long a node behind NAT answers logins from
// its last view of roles and CAs after its access watch broke: the
// watcher re-syncs after DefaultMinBackoff (500ms) over another tunnel,
// so 5s covers a re-sync that itself fails once, while a role or CA
// change still reaches such a node within seconds.
const tunnelNodeStaleGrace = 5 * time.Second

// startAccessCache gives the SSH servers their roles and CAs from memory
// (services.AccessCache): no backend read or auth API call per connection
// or session. It watches the backend when auth runs here, the auth API's
// access watch (roles and CA public keys) otherwise.
func (p *Process) startAccessCache(ctx context.Context, ap accessPoint) error {
	var events services.AccessEvents
	switch {
	case p.store != nil:
		events = p.store
	case p.authClient != nil:
		events = p.authClient.AccessEvents()
	default:
		p.sshAccess = ap
		return nil
	}
	var grace time.Duration
	if p.store == nil && p.cfg.ProxyServer != "" {
		// A node behind NAT watches auth over one of its tunnels: the
		// watch breaks each time that proxy restarts and re-syncs over
		// another tunnel within a second. Logins during that second are
		// answered from the last view rather than refused.
		grace = tunnelNodeStaleGrace
	}
	c, err := services.NewAccessCache(services.AccessCacheConfig{
		Events:     events,
		Clock:      p.clock,
		Logger:     p.log.WithField("component", "watcher:access"),
		StaleGrace: grace,
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.sshAccess = c
	p.onShutdown(func(context.Context) error { return c.Close() })
	wctx, cancel := context.WithTimeout(ctx, lockSyncWait)
	defer cancel()
	if err := c.WaitSynced(wctx); err != nil {
		p.log.WithError(err).Warn("Roles and CAs are not loaded yet: connections are refused until they are.")
	}
	return nil
}
