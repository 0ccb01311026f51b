package services

import (
	"context"
	"encoding/json"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
)

// Where a tunnel lives (several proxies): the
// proxy that holds a node's reverse tunnel writes a tunnel_connection with
// a lease of a few seconds and renews it while the tunnel lives, so that
// every other proxy learns within one watch event which peers can reach a
// tunnel node, instead of waiting for the node's next heartbeat (minutes).
// A proxy that dies stops renewing and its entries lapse by themselves.

const tunnelConnectionsPrefix = "tunnel_connections"

// DefaultTunnelConnectionTTL is the lease of a tunnel_connection: a proxy
// killed with -9 is forgotten by its peers within it. Renewals run every
// TTL/3 (TunnelConnectionRenewInterval), so two lost renewals in a row are
// survived.
const DefaultTunnelConnectionTTL = 6 * time.Second

// TunnelConnectionRenewInterval is how often a proxy renews its leases.
const TunnelConnectionRenewInterval = DefaultTunnelConnectionTTL / 3

// TunnelConnection says that proxy ProxyUUID holds a reverse tunnel from
// node NodeUUID. Auth writes it for the proxy named in the caller's
// certificate, never for one named in the request.
type TunnelConnection struct {
	// NodeUUID is the node whose tunnel it is.
	NodeUUID string `json:"node_uuid"`
	// ProxyUUID is the proxy holding the tunnel (its certificate's ID).
	ProxyUUID string `json:"proxy_uuid"`
	// PeerAddr is where the holding proxy serves peered dials
	// (host:port); empty when it does not peer.
	PeerAddr string `json:"peer_addr,omitempty"`
	// LastSeen is when auth last renewed the lease.
	LastSeen time.Time `json:"last_seen"`
	// Expires is the end of the lease.
	Expires time.Time `json:"expires"`
}

// TunnelConnectionKey is /tunnel_connections/NODE/PROXY: one entry per
// (node, proxy) pair, so a node with tunnels to two proxies (make before
// break) has two.
func TunnelConnectionKey(node, proxy string) string {
	return backend.Key(tunnelConnectionsPrefix, node, proxy)
}

// TunnelConnectionsPrefix is the prefix of every tunnel_connection key.
func TunnelConnectionsPrefix() string { return backend.Prefix(tunnelConnectionsPrefix) }

// parseTunnelConnectionKey is the inverse of TunnelConnectionKey.
func parseTunnelConnectionKey(key string) (node, proxy string, ok bool) {
	rest, ok := strings.CutPrefix(key, TunnelConnectionsPrefix())
	if !ok {
		return "", "", false
	}
	node, proxy, ok = strings.Cut(rest, backend.Separator)
	if !ok || node == "" || proxy == "" || strings.Contains(proxy, backend.Separator) {
		return "", "", false
	}
	return node, proxy, true
}

// Check validates a tunnel_connection before it is stored.
func (tc *TunnelConnection) Check() error {
	for name, v := range map[string]string{"node_uuid": tc.NodeUUID, "proxy_uuid": tc.ProxyUUID} {
		if v == "" {
			return trace.BadParameter("tunnel_connection: missing %s", name)
		}
		if len(v) > 256 || strings.ContainsAny(v, backend.Separator+"\x00\n\r ") {
			return trace.BadParameter("tunnel_connection: %s %q is not a valid UUID", name, v)
		}
	}
	if tc.PeerAddr != "" {
		if _, port, err := net.SplitHostPort(tc.PeerAddr); err != nil || port == "" || port == "0" {
			return trace.BadParameter("tunnel_connection: peer_addr %q is not HOST:PORT", tc.PeerAddr)
		}
	}
	if tc.Expires.IsZero() {
		return trace.BadParameter("tunnel_connection: missing expires (it is a lease)")
	}
	return nil
}

// UpsertTunnelConnection writes (or renews) one lease; the backend drops
// it at tc.Expires unless renewed.
func (s *Store) UpsertTunnelConnection(ctx context.Context, tc TunnelConnection) error {
	if err := tc.Check(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, TunnelConnectionKey(tc.NodeUUID, tc.ProxyUUID), tc, tc.Expires)
}

// DeleteTunnelConnection removes the lease of proxy for node (the tunnel
// closed). NotFound when there is none, which callers deleting on close
// may ignore: the lease may already have lapsed.
func (s *Store) DeleteTunnelConnection(ctx context.Context, node, proxy string) error {
	tc := TunnelConnection{NodeUUID: node, ProxyUUID: proxy, Expires: time.Unix(1, 0)}
	if err := tc.Check(); err != nil {
		return trace.Wrap(err)
	}
	return s.delete(ctx, TunnelConnectionKey(node, proxy), "tunnel_connection "+quote(node)+"/"+quote(proxy)+" not found")
}

// GetTunnelConnections lists every live lease.
func (s *Store) GetTunnelConnections(ctx context.Context) ([]TunnelConnection, error) {
	return getAllSkipping[TunnelConnection](ctx, s, TunnelConnectionsPrefix(), true)
}

// TunnelConnectionEvents is what a TunnelLocator consumes: the Store, or
// the auth client's /v1/watch/tunnel_connections.
type TunnelConnectionEvents interface {
	NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error)
	GetTunnelConnections(ctx context.Context) ([]TunnelConnection, error)
}

var _ TunnelConnectionEvents = (*Store)(nil)

// TunnelLocatorConfig configures a TunnelLocator.
type TunnelLocatorConfig struct {
	// Events feeds the locator. Required.
	Events TunnelConnectionEvents
	// Clock decides whether a lease is still valid. Nil: the real clock.
	Clock clockwork.Clock
	// Logger; nil means component "tunnellocator".
	Logger logrus.FieldLogger
	// MinBackoff and MaxBackoff bound re-sync retries.
	MinBackoff, MaxBackoff time.Duration
}

// TunnelLocator is every proxy's in-memory index of tunnel_connections:
// which proxies hold a tunnel to node X. The Router asks it before dialing
// a peer. Lookups filter expired leases with the Clock, so a lease whose
// proxy died stops being offered at its expiry even if the backend's
// delete event is late or the watch is broken.
type TunnelLocator struct {
	cfg TunnelLocatorConfig
	w   *ResourceWatcher[TunnelConnection]

	// mu guards byNode and waiters.
	mu sync.Mutex
	// byNode[node] are node's leases, one per proxy. A slice, not a map
	// per node: a node has tunnels to a handful of proxies at most, and a
	// Go map's first group costs about 1 KB (BenchmarkProxyIndexHeap in
	// lib/proxy: 11.8 MB for 10k tunnel nodes as maps).
	byNode map[string][]TunnelConnection
	// proxyStrings interns ProxyUUID and PeerAddr: a cluster has a few
	// proxies and every lease names one, so 10k tunnel nodes share a
	// handful of strings instead of holding 10k copies each. Emptied on
	// Reset, so proxies gone for good do not accumulate.
	proxyStrings map[string]string
	// waiters[node] is closed (and removed) when a lease for node is
	// written: a dial waiting for a tunnel anywhere blocks on it.
	waiters map[string]chan struct{}
}

// NewTunnelLocator starts the locator; stop it with Close.
func NewTunnelLocator(cfg TunnelLocatorConfig) (*TunnelLocator, error) {
	if cfg.Events == nil {
		return nil, trace.BadParameter("tunnel locator: missing Events")
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.WithField("component", "tunnellocator")
	}
	l := &TunnelLocator{cfg: cfg, byNode: map[string][]TunnelConnection{}, proxyStrings: map[string]string{}, waiters: map[string]chan struct{}{}}
	w, err := NewResourceWatcher(ResourceWatcherConfig[TunnelConnection]{
		Name:       "tunnel_connections",
		Source:     cfg.Events,
		Prefixes:   []string{TunnelConnectionsPrefix()},
		Load:       cfg.Events.GetTunnelConnections,
		Unmarshal:  unmarshalTunnelConnection,
		Collector:  (*tunnelCollector)(l),
		MinBackoff: cfg.MinBackoff,
		MaxBackoff: cfg.MaxBackoff,
		Clock:      cfg.Clock,
		Logger:     cfg.Logger,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	l.w = w
	return l, nil
}

func unmarshalTunnelConnection(item backend.Item) (TunnelConnection, error) {
	var tc TunnelConnection
	if err := json.Unmarshal(item.Value, &tc); err != nil {
		return TunnelConnection{}, trace.BadParameter("tunnel_connection record %q: %v", item.Key, err)
	}
	if node, proxy, ok := parseTunnelConnectionKey(item.Key); !ok || node != tc.NodeUUID || proxy != tc.ProxyUUID {
		return TunnelConnection{}, trace.BadParameter("tunnel_connection record %q names node %q proxy %q", item.Key, tc.NodeUUID, tc.ProxyUUID)
	}
	return tc, nil
}

// Close stops the locator.
func (l *TunnelLocator) Close() error { return l.w.Close() }

// Healthy is nil while the watch is live.
func (l *TunnelLocator) Healthy() error { return l.w.Healthy() }

// WaitSynced waits for the first load.
func (l *TunnelLocator) WaitSynced(ctx context.Context) error { return l.w.WaitSynced(ctx) }

// Holders returns the live leases for node, newest first, leaving out
// the proxy exclude (this proxy: its own tunnels are dialed locally).
func (l *TunnelLocator) Holders(node, exclude string) []TunnelConnection {
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []TunnelConnection
	for _, tc := range l.byNode[node] {
		if tc.ProxyUUID == exclude || !now.Before(tc.Expires) {
			continue
		}
		out = append(out, tc)
	}
	slices.SortFunc(out, func(a, b TunnelConnection) int {
		if c := b.LastSeen.Compare(a.LastSeen); c != 0 {
			return c
		}
		return strings.Compare(a.ProxyUUID, b.ProxyUUID)
	})
	return out
}

// Located returns a channel closed when a lease for node is next written.
// Callers check Holders after taking it, so a lease written in between is
// not missed.
func (l *TunnelLocator) Located(node string) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.waiters[node]
	if !ok {
		w = make(chan struct{})
		l.waiters[node] = w
	}
	return w
}

// tunnelCollector is the locator seen by its ResourceWatcher.
type tunnelCollector TunnelLocator

func (c *tunnelCollector) Reset(items []TunnelConnection) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byNode = map[string][]TunnelConnection{}
	c.proxyStrings = map[string]string{}
	for _, tc := range items {
		c.putLocked(tc)
	}
}

func (c *tunnelCollector) Put(tc TunnelConnection) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(tc)
}

func (c *tunnelCollector) putLocked(tc TunnelConnection) {
	tc.ProxyUUID, tc.PeerAddr = c.internLocked(tc.ProxyUUID), c.internLocked(tc.PeerAddr)
	leases := c.byNode[tc.NodeUUID]
	if len(leases) > 0 {
		tc.NodeUUID = leases[0].NodeUUID // shared with the map key
	}
	if i := slices.IndexFunc(leases, func(x TunnelConnection) bool { return x.ProxyUUID == tc.ProxyUUID }); i >= 0 {
		leases[i] = tc
	} else {
		c.byNode[tc.NodeUUID] = append(leases, tc)
	}
	if w, ok := c.waiters[tc.NodeUUID]; ok {
		close(w)
		delete(c.waiters, tc.NodeUUID)
	}
}

func (c *tunnelCollector) internLocked(s string) string {
	if v, ok := c.proxyStrings[s]; ok {
		return v
	}
	c.proxyStrings[s] = s
	return s
}

func (c *tunnelCollector) Delete(key string) {
	node, proxy, ok := parseTunnelConnectionKey(key)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	leases := slices.DeleteFunc(c.byNode[node], func(x TunnelConnection) bool { return x.ProxyUUID == proxy })
	if len(leases) == 0 {
		delete(c.byNode, node)
	} else {
		c.byNode[node] = leases
	}
}
