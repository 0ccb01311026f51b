package peer

import (
	"context"
	"slices"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// LeaseWriter writes this proxy's tunnel_connection leases: the auth
// client (the proxy is its certificate's ID there).
type LeaseWriter interface {
	UpsertTunnelConnections(ctx context.Context, req authapi.TunnelConnectionsRequest) error
	DeleteTunnelConnections(ctx context.Context, req authapi.TunnelConnectionsRequest) error
}

// TunnelSet is what the LeaseKeeper reads of the tunnel server
// (*reversetunnel.Server).
type TunnelSet interface {
	TunnelUUIDs() []string
	Changed() <-chan struct{}
}

// LeaseKeeperConfig configures a LeaseKeeper.
type LeaseKeeperConfig struct {
	// Tunnels is this proxy's tunnel server. Required.
	Tunnels TunnelSet
	// Leaves, when set, are the leaf clusters' tunnels on this proxy
	// (*reversetunnel.Leaves, IDs services.LeafTunnelID): leased like
	// nodes' so that peers reach those leaves through this proxy. Only
	// what the registry holds is ever leased.
	Leaves TunnelSet
	// Writer writes the leases. Required.
	Writer LeaseWriter
	// PeerAddr is where this proxy serves peered dials, written into
	// every lease. Required.
	PeerAddr string
	// RenewInterval: zero means services.TunnelConnectionRenewInterval.
	RenewInterval time.Duration
	// Deps: Clock drives renewals.
	observe.Deps
}

// LeaseKeeper keeps a tunnel_connection lease for every tunnel on this
// proxy: written as soon as a tunnel registers, renewed every
// RenewInterval, deleted when the tunnel goes and, for all of them, on
// Close. A proxy killed with -9 deletes nothing: its leases lapse at their
// TTL, which is why the TTL is seconds.
type LeaseKeeper struct {
	cfg    LeaseKeeperConfig
	cancel context.CancelFunc
	done   chan struct{}
	// held is the set last written; only the loop goroutine touches it
	// (and Close, after the loop has ended).
	held map[string]struct{}
}

// NewLeaseKeeper starts the keeper; stop it with Close.
func NewLeaseKeeper(cfg LeaseKeeperConfig) (*LeaseKeeper, error) {
	switch {
	case cfg.Tunnels == nil:
		return nil, trace.BadParameter("lease keeper: missing Tunnels")
	case cfg.Writer == nil:
		return nil, trace.BadParameter("lease keeper: missing Writer")
	case cfg.PeerAddr == "":
		return nil, trace.BadParameter("lease keeper: missing PeerAddr")
	}
	if cfg.RenewInterval <= 0 {
		cfg.RenewInterval = services.TunnelConnectionRenewInterval
	}
	cfg.Deps.SetDefaults(observe.ComponentPeerLeases)
	// The leases loop runs until Close: no caller's context.
	ctx, cancel := context.WithCancel(context.Background())
	k := &LeaseKeeper{cfg: cfg, cancel: cancel, done: make(chan struct{}), held: map[string]struct{}{}}
	go k.run(ctx)
	return k, nil
}

func (k *LeaseKeeper) run(ctx context.Context) {
	defer close(k.done)
	ticker := k.cfg.Clock.NewTicker(k.cfg.RenewInterval)
	defer ticker.Stop()
	for {
		changed := k.cfg.Tunnels.Changed()
		var leavesChanged <-chan struct{}
		if k.cfg.Leaves != nil {
			leavesChanged = k.cfg.Leaves.Changed()
		}
		now := k.heldNow()
		added, gone := diff(k.held, now)
		k.write(ctx, added, gone)
		select {
		case <-changed:
		case <-leavesChanged:
		case <-ticker.Chan():
			// Renew every lease, not just the new ones.
			k.write(ctx, k.heldNow(), nil)
		case <-ctx.Done():
			return
		}
	}
}

// heldNow is every tunnel ID this proxy holds now: nodes' and leaves'.
func (k *LeaseKeeper) heldNow() []string {
	now := k.cfg.Tunnels.TunnelUUIDs()
	if k.cfg.Leaves != nil {
		now = append(now, k.cfg.Leaves.TunnelUUIDs()...)
	}
	return now
}

// write upserts up and deletes gone, in batches; held follows what was
// actually written, so a failed write is retried on the next round.
func (k *LeaseKeeper) write(ctx context.Context, up, gone []string) {
	for batch := range slices.Chunk(up, authapi.MaxTunnelConnectionsPerRequest) {
		rctx, cancel := context.WithTimeout(ctx, k.cfg.RenewInterval)
		err := k.cfg.Writer.UpsertTunnelConnections(rctx, authapi.TunnelConnectionsRequest{PeerAddr: k.cfg.PeerAddr, NodeUUIDs: batch})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				k.cfg.Logger.WithError(err).WithField("count", len(batch)).Warn("Could not write tunnel leases; peers may not find these tunnels until the next renewal.")
			}
			continue
		}
		for _, u := range batch {
			k.held[u] = struct{}{}
		}
	}
	if len(gone) > 0 {
		k.remove(ctx, gone)
	}
}

func (k *LeaseKeeper) remove(ctx context.Context, gone []string) {
	for batch := range slices.Chunk(gone, authapi.MaxTunnelConnectionsPerRequest) {
		rctx, cancel := context.WithTimeout(ctx, k.cfg.RenewInterval)
		err := k.cfg.Writer.DeleteTunnelConnections(rctx, authapi.TunnelConnectionsRequest{NodeUUIDs: batch})
		cancel()
		if err != nil {
			// The lease lapses at its TTL anyway.
			k.cfg.Logger.WithError(err).Debug("Could not delete tunnel leases; they lapse at their TTL.")
		}
		for _, u := range batch {
			delete(k.held, u)
		}
	}
}

// diff returns what is in now and not in held, and the reverse.
func diff(held map[string]struct{}, now []string) (added, gone []string) {
	in := make(map[string]struct{}, len(now))
	for _, u := range now {
		in[u] = struct{}{}
		if _, ok := held[u]; !ok {
			added = append(added, u)
		}
	}
	for u := range held {
		if _, ok := in[u]; !ok {
			gone = append(gone, u)
		}
	}
	return added, gone
}

// Close stops renewing and deletes every lease this keeper wrote, bounded
// by ctx: peers stop sending dials here at once instead of at the TTL.
func (k *LeaseKeeper) Close(ctx context.Context) error {
	k.cancel()
	<-k.done
	if len(k.held) > 0 {
		all := make([]string, 0, len(k.held))
		for u := range k.held {
			all = append(all, u)
		}
		k.remove(ctx, all)
	}
	return nil
}
