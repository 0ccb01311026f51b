package services

import (
	"context"
	"encoding/json"
	"sync/atomic"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
)

// NetworkingEvents is what a NetworkingWatcher consumes: a watch and a
// read of the config. *Store provides it, and so can an auth client.
type NetworkingEvents interface {
	NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error)
	GetClusterNetworkingConfig(ctx context.Context) (*ClusterNetworkingConfig, error)
}

var _ NetworkingEvents = (*Store)(nil)

// NetworkingWatcherConfig configures a NetworkingWatcher.
type NetworkingWatcherConfig struct {
	// Events is read and watched. Required.
	Events NetworkingEvents
	// Clock drives re-sync backoff; nil means the real clock.
	Clock clockwork.Clock
	// Logger; nil means logrus with component "watcher:networking".
	Logger logrus.FieldLogger
}

// NetworkingWatcher serves the cluster networking config from memory, kept
// current by a ResourceWatcher. The Router asks for the config on every
// connection; this makes that an atomic load instead of a backend read,
// while a `pctl set networking` still applies to the next connection
// after its event arrives (milliseconds), with no restart.
type NetworkingWatcher struct {
	w   *ResourceWatcher[*ClusterNetworkingConfig]
	cur *networkingCollector
}

// NewNetworkingWatcher starts the watcher; stop it with Close.
func NewNetworkingWatcher(cfg NetworkingWatcherConfig) (*NetworkingWatcher, error) {
	if cfg.Events == nil {
		return nil, trace.BadParameter("networking watcher: missing Events")
	}
	c := &networkingCollector{key: networkingKey()}
	c.v.Store(DefaultClusterNetworkingConfig())
	rw, err := NewResourceWatcher(ResourceWatcherConfig[*ClusterNetworkingConfig]{
		Name:     "networking",
		Source:   cfg.Events,
		Prefixes: []string{networkingKey()},
		Load: func(ctx context.Context) ([]*ClusterNetworkingConfig, error) {
			c, err := cfg.Events.GetClusterNetworkingConfig(ctx)
			if err != nil {
				return nil, trace.Wrap(err)
			}
			return []*ClusterNetworkingConfig{c}, nil
		},
		Unmarshal: func(item backend.Item) (*ClusterNetworkingConfig, error) {
			var c ClusterNetworkingConfig
			if err := json.Unmarshal(item.Value, &c); err != nil {
				return nil, trace.BadParameter("networking config: %v", err)
			}
			if err := c.CheckAndSetDefaults(); err != nil {
				return nil, trace.Wrap(err)
			}
			return &c, nil
		},
		Collector: c,
		Clock:     cfg.Clock,
		Logger:    cfg.Logger,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &NetworkingWatcher{w: rw, cur: c}, nil
}

// GetClusterNetworkingConfig returns a copy of the current config. Before
// the first sync it waits for it, bounded by ctx.
func (n *NetworkingWatcher) GetClusterNetworkingConfig(ctx context.Context) (*ClusterNetworkingConfig, error) {
	if err := n.w.WaitSynced(ctx); err != nil {
		return nil, trace.Wrap(err)
	}
	c := *n.cur.v.Load()
	return &c, nil
}

// Synced is closed once the first load is done.
func (n *NetworkingWatcher) Synced() <-chan struct{} { return n.w.Synced() }

// Healthy is nil while the watch is live.
func (n *NetworkingWatcher) Healthy() error { return n.w.Healthy() }

// Close stops the watcher.
func (n *NetworkingWatcher) Close() error { return n.w.Close() }

// Done is closed once the watcher has stopped.
func (n *NetworkingWatcher) Done() <-chan struct{} { return n.w.Done() }

// networkingCollector holds the one config; a delete restores the
// defaults, exactly as Store.GetClusterNetworkingConfig reads a missing key.
type networkingCollector struct {
	key string
	v   atomic.Pointer[ClusterNetworkingConfig]
}

func (c *networkingCollector) Reset(items []*ClusterNetworkingConfig) {
	if len(items) == 0 {
		c.v.Store(DefaultClusterNetworkingConfig())
		return
	}
	c.v.Store(items[len(items)-1])
}

func (c *networkingCollector) Put(item *ClusterNetworkingConfig) { c.v.Store(item) }

func (c *networkingCollector) Delete(key string) {
	if key == c.key {
		c.v.Store(DefaultClusterNetworkingConfig())
	}
}
