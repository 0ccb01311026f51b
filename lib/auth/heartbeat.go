package auth

import (
	"context"
	"sync"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// Announcer stores a node heartbeat: the node's Client (the Store in
// tests that plant inventory).
type Announcer interface {
	UpsertNode(ctx context.Context, node services.Node) error
}

var (
	_ Announcer = (*services.Store)(nil)
	_ Announcer = (*Client)(nil)
)

const (
	// DefaultHeartbeatInterval: a new or moved node is routable within
	// 10 s, and 1k nodes cost auth 100 small writes a second.
	DefaultHeartbeatInterval = 10 * time.Second
	// heartbeatTTLFactor: the TTL is three intervals, so a node survives
	// two lost heartbeats (an auth restart, a network blip) and a dead node
	// leaves routing at most three intervals after its last heartbeat.
	heartbeatTTLFactor = 3
)

// HeartbeatConfig configures a Heartbeat.
type HeartbeatConfig struct {
	// Announcer receives the heartbeats; required unless Announce is set.
	Announcer Announcer
	// GetNode returns the node's current record (labels and address may
	// change between beats); required with Announcer. Expires and
	// LastHeartbeat are set by the heartbeat.
	GetNode func() services.Node
	// Announce, instead of Announcer and GetNode, announces something
	// other than a node (a proxy's record) with the given dates: the
	// ticker, the TTL rules and the retry are the same for every kind.
	Announce func(ctx context.Context, lastHeartbeat, expires time.Time) error
	// Interval between heartbeats; zero means DefaultHeartbeatInterval.
	Interval time.Duration
	// TTL of each record; zero means 3 x Interval. Must exceed Interval.
	// Through the auth API this is only a request: the auth server dates
	// the record itself and caps the TTL at MaxHeartbeatTTL.
	TTL time.Duration
	// Deps: Clock drives the ticker.
	observe.Deps
}

// CheckAndSetDefaults validates the config.
func (c *HeartbeatConfig) CheckAndSetDefaults() error {
	if c.Announce == nil {
		if c.Announcer == nil {
			return trace.BadParameter("heartbeat: missing Announcer")
		}
		if c.GetNode == nil {
			return trace.BadParameter("heartbeat: missing GetNode")
		}
		announcer, getNode := c.Announcer, c.GetNode
		c.Announce = func(ctx context.Context, last, expires time.Time) error {
			node := getNode()
			node.LastHeartbeat, node.Expires = last, expires
			return trace.Wrap(announcer.UpsertNode(ctx, node), "node %q", node.UUID)
		}
	}
	if c.Interval <= 0 {
		c.Interval = DefaultHeartbeatInterval
	}
	if c.TTL == 0 {
		c.TTL = heartbeatTTLFactor * c.Interval
	}
	if c.TTL <= c.Interval {
		return trace.BadParameter("heartbeat: TTL %v must be longer than the interval %v, or the node would flicker out of routing between beats", c.TTL, c.Interval)
	}
	c.Deps.SetDefaults(observe.ComponentHeartbeat)
	return nil
}

// Heartbeat announces a node now and every Interval until closed. Run owns
// the loop (the caller runs it in a goroutine); Close stops it and Done
// fires when Run has returned.
type Heartbeat struct {
	cfg    HeartbeatConfig
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	// announced receives a value after each attempt (buffered, dropped
	// when nobody reads): tests and start-up code can wait for the first.
	announced chan error
}

// NewHeartbeat makes a heartbeat; call Run to start it.
func NewHeartbeat(cfg HeartbeatConfig) (*Heartbeat, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	// The heartbeat owns its loop (Close ends it): no caller's context.
	ctx, cancel := context.WithCancel(context.Background())
	return &Heartbeat{
		cfg:       cfg,
		ctx:       ctx,
		cancel:    cancel,
		done:      make(chan struct{}),
		announced: make(chan error, 1),
	}, nil
}

// Run announces until Close. A failed announcement is logged and retried
// at the next tick: the TTL leaves room for two misses.
func (h *Heartbeat) Run() error {
	defer close(h.done)
	if h.ctx.Err() != nil {
		return nil // closed before it started
	}
	ticker := h.cfg.Clock.NewTicker(h.cfg.Interval)
	defer ticker.Stop()
	for {
		h.announce()
		select {
		case <-ticker.Chan():
		case <-h.ctx.Done():
			return nil
		}
	}
}

func (h *Heartbeat) announce() {
	now := h.cfg.Clock.Now().UTC()
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.Interval)
	err := h.cfg.Announce(ctx, now, now.Add(h.cfg.TTL))
	cancel()
	if err != nil && h.ctx.Err() == nil {
		h.cfg.Logger.WithError(err).Warn("Heartbeat failed.")
	}
	select {
	case <-h.announced: // keep only the latest result
	default:
	}
	h.announced <- err
}

// Announced delivers the result of the latest announcement not yet read.
func (h *Heartbeat) Announced() <-chan error { return h.announced }

// Close makes Run return; wait on Done for it (Run may never have started).
func (h *Heartbeat) Close() error {
	h.once.Do(h.cancel)
	return nil
}

// Done is closed when Run has returned.
func (h *Heartbeat) Done() <-chan struct{} { return h.done }
