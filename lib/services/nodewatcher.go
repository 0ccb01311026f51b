package services

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
)

// NodeEvents is what the NodeWatcher consumes: a watch over node keys and a
// way to load the nodes. The Store's backend plus Store.GetNodes provide it
// (see Store.NodeEvents); later an auth client relaying events will too.
type NodeEvents interface {
	NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error)
	GetNodes(ctx context.Context, cluster string) ([]Node, error)
}

// NewWatcher starts a backend watch: with GetNodes and
// GetClusterNetworkingConfig it makes the Store a NodeEvents and a
// NetworkingEvents source.
func (s *Store) NewWatcher(ctx context.Context, w backend.Watch) (backend.Watcher, error) {
	return s.b.NewWatcher(ctx, w)
}

var _ NodeEvents = (*Store)(nil)

// NodeEvents returns the store as a NodeEvents source.
func (s *Store) NodeEvents() NodeEvents { return s }

// NodeQuery asks the NodeWatcher for the nodes a routing target may mean.
type NodeQuery struct {
	// Cluster is required.
	Cluster string
	// Host is compared to each node's UUID, Hostname and address host.
	Host string
	// CaseInsensitive compares hostnames with strings.EqualFold.
	CaseInsensitive bool
}

// NodeWatcherConfig configures a NodeWatcher.
type NodeWatcherConfig struct {
	// Events is the source of node records. Required.
	Events NodeEvents
	// Clock decides expiry and drives pruning and backoff. Nil means the
	// real clock.
	Clock clockwork.Clock
	// Logger; nil means logrus with component "nodewatcher".
	//
	// Clock and Logger are not observe.Deps: services is one of the few
	// packages lib/api may import (TestLeaf in lib/api), and observe
	// would bring the OpenTelemetry API and the audit package's
	// dependants into every client of the wire types.
	Logger logrus.FieldLogger
	// PruneInterval is how often expired nodes are dropped from memory.
	// Lookups never return an expired node regardless (they filter with
	// the Clock); pruning only bounds memory held by dead records when
	// the backend's delete events are late. Zero means
	// DefaultNodePruneInterval.
	PruneInterval time.Duration
	// MinBackoff and MaxBackoff bound re-sync retries, see
	// ResourceWatcherConfig.
	MinBackoff, MaxBackoff time.Duration
	// QueueSize is the backend watch queue size; zero means the backend
	// default. Large clusters heartbeat in bursts: a proxy for 100k nodes
	// wants more.
	QueueSize int
}

// DefaultNodePruneInterval: heartbeat TTLs are minutes, so a dead node
// lingering a few extra seconds in memory (invisible to lookups) is fine.
const DefaultNodePruneInterval = 15 * time.Second

// CheckAndSetDefaults validates the config.
func (c *NodeWatcherConfig) CheckAndSetDefaults() error {
	if c.Events == nil {
		return trace.BadParameter("node watcher: missing Events")
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = logrus.WithField("component", "nodewatcher")
	}
	if c.PruneInterval <= 0 {
		c.PruneInterval = DefaultNodePruneInterval
	}
	return nil
}

// NodeWatcher holds every node of every cluster once per process, fed by
// backend events, indexed for routing. Lookups touch only the index buckets
// they need and copy only the matches, so routing cost does not grow with
// the cluster.
//
// Node values are immutable once stored: a heartbeat replaces the *Node, it
// never edits one. Find returns struct copies whose Labels map is shared
// with the watcher's copy; callers must treat Labels as read-only (nothing
// in Postern writes to a routed node's labels).
type NodeWatcher struct {
	cfg     NodeWatcherConfig
	watcher *ResourceWatcher[Node]
	idx     *nodeIndex

	stopPrune chan struct{}
	pruneDone chan struct{}
	closeOnce sync.Once
	done      chan struct{}
}

// NewNodeWatcher starts watching; stop it with Close.
func NewNodeWatcher(cfg NodeWatcherConfig) (*NodeWatcher, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	idx := newNodeIndex()
	rw, err := NewResourceWatcher(ResourceWatcherConfig[Node]{
		Name:     "nodes",
		Source:   cfg.Events,
		Prefixes: []string{NodesPrefix()},
		Load: func(ctx context.Context) ([]Node, error) {
			return cfg.Events.GetNodes(ctx, "")
		},
		Unmarshal:  unmarshalNodeItem,
		Collector:  idx,
		QueueSize:  cfg.QueueSize,
		MinBackoff: cfg.MinBackoff,
		MaxBackoff: cfg.MaxBackoff,
		Clock:      cfg.Clock,
		Logger:     cfg.Logger,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	w := &NodeWatcher{
		cfg:       cfg,
		watcher:   rw,
		idx:       idx,
		stopPrune: make(chan struct{}),
		pruneDone: make(chan struct{}),
		done:      make(chan struct{}),
	}
	go w.pruneLoop()
	return w, nil
}

func unmarshalNodeItem(item backend.Item) (Node, error) {
	var n Node
	if err := json.Unmarshal(item.Value, &n); err != nil {
		return Node{}, trace.BadParameter("node record %q: %v", item.Key, err)
	}
	// Key and body must agree, or a delete event (which carries only the
	// key) could never remove this node.
	if cluster, uuid, ok := ParseNodeKey(item.Key); !ok || cluster != n.Cluster || uuid != n.UUID {
		return Node{}, trace.BadParameter("node record %q names node %q in cluster %q", item.Key, n.UUID, n.Cluster)
	}
	return n, nil
}

// Close stops the watcher and its goroutines and waits for them.
func (w *NodeWatcher) Close() error {
	w.closeOnce.Do(func() {
		close(w.stopPrune)
		w.watcher.Close()
		<-w.pruneDone
		close(w.done)
	})
	return nil
}

// Done is closed when the watcher has been closed.
func (w *NodeWatcher) Done() <-chan struct{} { return w.done }

// Healthy is nil when the watch is live; see ResourceWatcher.Healthy.
func (w *NodeWatcher) Healthy() error { return w.watcher.Healthy() }

// Failures counts broken watches and failed syncs.
func (w *NodeWatcher) Failures() uint64 { return w.watcher.Failures() }

// WaitSynced waits for the first load; see ResourceWatcher.WaitSynced.
func (w *NodeWatcher) WaitSynced(ctx context.Context) error { return w.watcher.WaitSynced(ctx) }

// Len is the number of node records held, including any that expired since
// the last prune (Find never returns those).
func (w *NodeWatcher) Len() int { return w.idx.len() }

// Find returns copies of the live nodes in q.Cluster whose UUID equals
// q.Host, or whose Hostname equals it (EqualFold when q.CaseInsensitive),
// or whose address host equals it. Before the first sync it waits (bounded
// by ctx) rather than answer "none": an empty answer at start-up would
// tell a user their node does not exist.
func (w *NodeWatcher) Find(ctx context.Context, q NodeQuery) ([]Node, error) {
	if q.Cluster == "" {
		return nil, trace.BadParameter("node query: missing cluster")
	}
	if err := w.watcher.WaitSynced(ctx); err != nil {
		return nil, trace.Wrap(err)
	}
	return w.idx.find(q, w.cfg.Clock.Now()), nil
}

// GetNodes returns copies of every live node of cluster ("" = all). It is
// O(n) and meant for listings (`psh ls`, the web UI), not for routing.
func (w *NodeWatcher) GetNodes(ctx context.Context, cluster string) ([]Node, error) {
	if err := w.watcher.WaitSynced(ctx); err != nil {
		return nil, trace.Wrap(err)
	}
	return w.idx.all(cluster, w.cfg.Clock.Now()), nil
}

// OpenSSHNodes returns copies of the live NodeKindOpenSSH nodes of
// cluster: what the proxies health-check. It costs what there are of
// them, not the size of the inventory.
func (w *NodeWatcher) OpenSSHNodes(ctx context.Context, cluster string) ([]Node, error) {
	if err := w.watcher.WaitSynced(ctx); err != nil {
		return nil, trace.Wrap(err)
	}
	return w.idx.openSSH(cluster, w.cfg.Clock.Now()), nil
}

func (w *NodeWatcher) pruneLoop() {
	defer close(w.pruneDone)
	t := w.cfg.Clock.NewTicker(w.cfg.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-t.Chan():
			if n := w.idx.prune(w.cfg.Clock.Now()); n > 0 {
				w.cfg.Logger.WithField("count", n).Debug("Pruned expired nodes.")
			}
		case <-w.stopPrune:
			return
		}
	}
}

// nodeIndex is the NodeWatcher's Collector: per-cluster indexes of
// immutable *Node values.
type nodeIndex struct {
	// mu guards clusters and count. Writers are the watcher goroutine and
	// the prune loop; readers are lookups. No other lock is taken while it
	// is held.
	mu       sync.RWMutex
	clusters map[string]*clusterNodes
	count    int
}

// clusterNodes indexes one cluster. Buckets are small slices: many nodes
// share a hostname only in the recycled-hostname case routing must report.
type clusterNodes struct {
	byUUID map[string]*Node
	byHost map[string][]*Node // exact hostname
	// byLower indexes strings.ToLower(hostname) only for hostnames that
	// have upper-case letters: the usual all-lower-case hostname is found
	// in byHost under its lower-case form, which saves an entry per node.
	byLower map[string][]*Node
	byAddr  map[string][]*Node // canonical address host
	// openssh holds the NodeKindOpenSSH nodes by UUID: the proxies'
	// health checker walks them every round, and must not walk the
	// whole inventory to find a few.
	openssh map[string]*Node
}

func newNodeIndex() *nodeIndex {
	return &nodeIndex{clusters: map[string]*clusterNodes{}}
}

var _ Collector[Node] = (*nodeIndex)(nil)

// CanonicalAddrHost is the form address hosts are indexed and looked up
// in: IP addresses in their canonical text (so "::1", "0:0::1" and
// "[::1]" agree; IPv4-mapped IPv6 as IPv4), DNS names lower-cased (DNS is
// case-insensitive), and anything else as is.
func CanonicalAddrHost(host string) string {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().String()
	}
	return strings.ToLower(host)
}

// addrHost returns the canonical host of a node address.
func addrHost(addr string) string {
	host, _, err := SplitAddr(addr)
	if err != nil {
		return ""
	}
	return CanonicalAddrHost(host)
}

func (ix *nodeIndex) Reset(nodes []Node) {
	clusters := map[string]*clusterNodes{}
	count := 0
	for i := range nodes {
		n := nodes[i]
		c := clusters[n.Cluster]
		if c == nil {
			c = newClusterNodes()
			clusters[n.Cluster] = c
		}
		if c.remove(n.UUID) {
			count--
		}
		c.add(&n)
		count++
	}
	ix.mu.Lock()
	ix.clusters, ix.count = clusters, count
	ix.mu.Unlock()
}

func (ix *nodeIndex) Put(n Node) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	c := ix.clusters[n.Cluster]
	if c == nil {
		c = newClusterNodes()
		ix.clusters[n.Cluster] = c
	}
	if !c.remove(n.UUID) {
		ix.count++
	}
	c.add(&n)
}

func (ix *nodeIndex) Delete(key string) {
	cluster, uuid, ok := ParseNodeKey(key)
	if !ok {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.deleteLocked(cluster, uuid)
}

func (ix *nodeIndex) deleteLocked(cluster, uuid string) {
	c := ix.clusters[cluster]
	if c == nil {
		return
	}
	if c.remove(uuid) {
		ix.count--
	}
	if len(c.byUUID) == 0 {
		delete(ix.clusters, cluster)
	}
}

func (ix *nodeIndex) len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.count
}

func expired(n *Node, now time.Time) bool {
	return !n.Expires.IsZero() && !now.Before(n.Expires)
}

// find is the routing lookup: at most four map reads, then a walk of the
// (small) matching buckets. Allocations: the result slice, plus a
// lower-cased copy of q.Host when it has upper-case letters.
func (ix *nodeIndex) find(q NodeQuery, now time.Time) []Node {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	c := ix.clusters[q.Cluster]
	if c == nil {
		return nil
	}
	var out []Node
	add := func(n *Node) {
		if n == nil || expired(n, now) {
			return
		}
		for i := range out {
			if out[i].UUID == n.UUID {
				return
			}
		}
		out = append(out, *n)
	}
	add(c.byUUID[q.Host])
	if q.CaseInsensitive {
		lower := strings.ToLower(q.Host)
		for _, n := range c.byHost[lower] {
			add(n)
		}
		for _, n := range c.byLower[lower] {
			add(n)
		}
	} else {
		for _, n := range c.byHost[q.Host] {
			add(n)
		}
	}
	for _, n := range c.byAddr[CanonicalAddrHost(q.Host)] {
		add(n)
	}
	return out
}

func (ix *nodeIndex) all(cluster string, now time.Time) []Node {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []Node
	for name, c := range ix.clusters {
		if cluster != "" && name != cluster {
			continue
		}
		for _, n := range c.byUUID {
			if !expired(n, now) {
				out = append(out, *n)
			}
		}
	}
	return out
}

func (ix *nodeIndex) openSSH(cluster string, now time.Time) []Node {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	c := ix.clusters[cluster]
	if c == nil {
		return nil
	}
	out := make([]Node, 0, len(c.openssh))
	for _, n := range c.openssh {
		if !expired(n, now) {
			out = append(out, *n)
		}
	}
	return out
}

// prune drops expired nodes and returns how many. It is O(n) and runs on
// the prune ticker only, never on the lookup path.
func (ix *nodeIndex) prune(now time.Time) int {
	type ref struct{ cluster, uuid string }
	var dead []ref
	ix.mu.RLock()
	for name, c := range ix.clusters {
		for _, n := range c.byUUID {
			if expired(n, now) {
				dead = append(dead, ref{name, n.UUID})
			}
		}
	}
	ix.mu.RUnlock()
	if len(dead) == 0 {
		return 0
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	pruned := 0
	for _, d := range dead {
		// Re-check under the write lock: a heartbeat may have revived it.
		if c := ix.clusters[d.cluster]; c != nil {
			if n := c.byUUID[d.uuid]; n != nil && expired(n, now) {
				ix.deleteLocked(d.cluster, d.uuid)
				pruned++
			}
		}
	}
	return pruned
}

func newClusterNodes() *clusterNodes {
	return &clusterNodes{
		byUUID:  map[string]*Node{},
		byHost:  map[string][]*Node{},
		byLower: map[string][]*Node{},
		byAddr:  map[string][]*Node{},
		openssh: map[string]*Node{},
	}
}

func (c *clusterNodes) add(n *Node) {
	c.byUUID[n.UUID] = n
	c.byHost[n.Hostname] = append(c.byHost[n.Hostname], n)
	if lower := strings.ToLower(n.Hostname); lower != n.Hostname {
		c.byLower[lower] = append(c.byLower[lower], n)
	}
	if h := addrHost(n.Addr); h != "" {
		c.byAddr[h] = append(c.byAddr[h], n)
	}
	if n.IsOpenSSH() {
		c.openssh[n.UUID] = n
	}
}

// remove drops the node with uuid from every index; false if absent.
func (c *clusterNodes) remove(uuid string) bool {
	old := c.byUUID[uuid]
	if old == nil {
		return false
	}
	delete(c.byUUID, uuid)
	delete(c.openssh, uuid)
	removeFromBucket(c.byHost, old.Hostname, old)
	if lower := strings.ToLower(old.Hostname); lower != old.Hostname {
		removeFromBucket(c.byLower, lower, old)
	}
	if h := addrHost(old.Addr); h != "" {
		removeFromBucket(c.byAddr, h, old)
	}
	return true
}

func removeFromBucket(m map[string][]*Node, key string, n *Node) {
	b := m[key]
	for i, x := range b {
		if x == n {
			last := len(b) - 1
			b[i] = b[last]
			b[last] = nil
			b = b[:last]
			break
		}
	}
	if len(b) == 0 {
		delete(m, key)
		return
	}
	m[key] = b
}
