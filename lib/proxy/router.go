// Package proxy decides where a connection goes and opens it: the Router is
// shared by the SSH proxy (subsystem and direct-tcpip), the web terminal and
// `pctl route`, so the same target gets the same answer on every path.
//
// Routing is split in two. Route is a pure decision over the NodeWatcher's
// in-memory inventory, the caller's access filter and the live networking
// config: no network, so it is table-tested and explainable. DialHost
// (routerdial.go) runs Route and then opens exactly the chosen node: its
// tunnel on this proxy, a peer proxy holding one, or its registered address
// (bounded by ssh_dial_timeout, handed over only once the node answered as
// an SSH server).
package proxy

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// NodeFinder answers which nodes a host may mean; *services.NodeWatcher is
// the production one.
type NodeFinder interface {
	Find(ctx context.Context, q services.NodeQuery) ([]services.Node, error)
}

// NetworkingGetter reads the cluster networking config. It is called on
// every Route, so a change (say to most_recent) applies to the next
// connection without a restart.
type NetworkingGetter interface {
	GetClusterNetworkingConfig(ctx context.Context) (*services.ClusterNetworkingConfig, error)
}

// Dialer opens the TCP connection to a node; *net.Dialer is one.
type Dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

var (
	_ NodeFinder       = (*services.NodeWatcher)(nil)
	_ NetworkingGetter = (*services.Store)(nil)
	_ Dialer           = (*net.Dialer)(nil)
)

// RouterConfig configures a Router.
type RouterConfig struct {
	// ClusterName is the local cluster: targets without a cluster route
	// here. Required.
	ClusterName string
	// NodeWatcher finds nodes. Required.
	NodeWatcher NodeFinder
	// Networking supplies the routing strategy, case sensitivity and dial
	// timeout. Required.
	Networking NetworkingGetter
	// Dialer dials nodes; nil means a net.Dialer with KeepAlive and
	// TCPUserTimeout applied.
	Dialer Dialer
	// KeepAlive configures TCP keep-alives on the proxy -> node leg of
	// the default Dialer; zero fields mean DefaultKeepAliveIdle,
	// DefaultKeepAliveInterval and DefaultKeepAliveCount.
	KeepAlive net.KeepAliveConfig
	// TCPUserTimeout fails a node connection whose sent data stays
	// unacknowledged this long (Linux TCP_USER_TIMEOUT) on the default
	// Dialer; zero means DefaultTCPUserTimeout, negative turns it off.
	TCPUserTimeout time.Duration
	// Deps: Clock times routing decisions and stamps Sites; Tracer
	// starts the route and dial spans; Metrics holds the router's
	// metrics. Audit is unused.
	observe.Deps
	// Tunnels, when set, are the reverse tunnels connected to this proxy
	// (*reversetunnel.Server): a node with a tunnel here is dialed over
	// it, and a tunnel-only node is waited for (tunnel_find_timeout).
	// Nil means this proxy holds no tunnels: tunnel-only nodes are
	// offline.
	Tunnels TunnelDialer
	// Peers, when set, reach tunnels held by other proxies
	// (*peer.Client): a node whose tunnel is on a peer is dialed through
	// that peer. Nil means no peering: only this proxy's tunnels count.
	Peers PeerDialer
	// Leaves, when set, are the tunnels from this cluster's leaf
	// clusters on this proxy (*reversetunnel.Leaves): a leaf with a
	// tunnel here, or leased by a peer (Peers), is a cluster targets may
	// name (`@LEAF`, `HOST.LEAF`), routed by the leaf (leafroute.go). Nil
	// means this proxy routes to its own cluster only.
	Leaves LeafTunnels
	// RemoteClusters lists this cluster's leaves for Sites (status,
	// last_connected); nil lists the local cluster only.
	RemoteClusters RemoteClusterLister
	// Health, when set, says whether an OpenSSH node (kind openssh)
	// answers (*health.Checker): one that does not is offline, like a
	// tunnel node without a tunnel. Nil means every OpenSSH node is
	// dialed (a dead one fails at the dial).
	Health NodeHealth
	// Locks, when set, refuses to dial a locked node (`pctl lock --node`)
	// with the lock's message; *services.LockWatcher is one. Nil means no
	// node locks.
	Locks NodeLocks
}

// NodeHealth is what the Router uses of the OpenSSH nodes' health
// checker (*health.Checker).
type NodeHealth interface {
	// Online reports whether node uuid's SSH server answered its last
	// check (true when not checked yet).
	Online(uuid string) bool
}

// TunnelDialer is what the Router uses of the tunnel server.
type TunnelDialer interface {
	// HasTunnel reports whether a tunnel from node uuid is here.
	HasTunnel(uuid string) bool
	// TunnelRegistered is closed when a tunnel from uuid next registers.
	TunnelRegistered(uuid string) <-chan struct{}
	// DialTunnel opens a connection to node uuid's SSH server over its
	// tunnel; NotFound when there is none. source and destination name
	// the client and its target for the node's audit log.
	DialTunnel(ctx context.Context, uuid, source, destination string) (net.Conn, error)
}

// PeerDialer is what the Router uses of proxy peering (*peer.Client).
type PeerDialer interface {
	// PeerHolders lists the peer proxies (UUIDs, best first) holding a
	// tunnel from node; this proxy is never among them.
	PeerHolders(node string) []string
	// PeerLocated is closed when a peer next reports a tunnel from node.
	PeerLocated(node string) <-chan struct{}
	// DialPeer asks peer proxy to dial node over its own tunnel; NotFound
	// when it holds none.
	DialPeer(ctx context.Context, proxy, node, source, destination string) (net.Conn, error)
}

// maxPeerCandidates bounds the peers dialed in parallel for one dial: a
// node has at most a couple of tunnels (make before break), and a stale
// lease list must not fan a dial out to every proxy.
const maxPeerCandidates = 3

// NodeLocks checks locks; its error for a locked node is a
// *services.LockedError.
type NodeLocks interface {
	Check(targets ...services.LockTarget) error
}

// CheckAndSetDefaults validates the config and fills in defaults.
func (c *RouterConfig) CheckAndSetDefaults() error {
	if c.ClusterName == "" {
		return trace.BadParameter("router: missing ClusterName")
	}
	if err := services.CheckClusterName(c.ClusterName); err != nil {
		return trace.Wrap(err)
	}
	if c.NodeWatcher == nil {
		return trace.BadParameter("router: missing NodeWatcher")
	}
	if c.Networking == nil {
		return trace.BadParameter("router: missing Networking")
	}
	c.KeepAlive.Enable = true
	if c.KeepAlive.Idle == 0 {
		c.KeepAlive.Idle = DefaultKeepAliveIdle
	}
	if c.KeepAlive.Interval == 0 {
		c.KeepAlive.Interval = DefaultKeepAliveInterval
	}
	if c.KeepAlive.Count == 0 {
		c.KeepAlive.Count = DefaultKeepAliveCount
	}
	if c.TCPUserTimeout == 0 {
		c.TCPUserTimeout = DefaultTCPUserTimeout
	}
	if c.Dialer == nil {
		c.Dialer = newNodeDialer(c.KeepAlive, c.TCPUserTimeout)
	}
	c.Deps.SetDefaults(observe.ComponentRouter)
	return nil
}

// Router routes targets to nodes. It is safe for concurrent use and meant
// to be constructed once per process.
type Router struct {
	cfg     RouterConfig
	metrics *routerMetrics
	// access caches leaves' answers for Sites; seen remembers which
	// leaves accepted a certificate (leafroute.go).
	access leafAccessCache
	seen   leafSeen
}

// NewRouter returns a Router.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	m, err := newRouterMetrics(cfg.Metrics)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &Router{cfg: cfg, metrics: m}, nil
}

// Route is a routing decision: plain data, to be logged, explained and
// tested without a network.
type Route struct {
	// Node is the chosen node (zero when routing failed).
	Node services.Node
	// Reason says in words why Node was chosen.
	Reason string
	// Candidates are every node the caller may reach that matched host
	// and port, sorted by UUID; on an ambiguous error they are the nodes
	// listed in it.
	Candidates []services.Node
	// Hidden are the UUIDs of nodes that matched host and port but that
	// the caller's AccessFilter refused. They took no part in the
	// decision and are for logs and the audit log only: never show them
	// to the caller.
	Hidden []string
	// Cluster is the cluster the target resolved to.
	Cluster string
	// Target is the target after NAME.CLUSTER resolution (rule 0).
	Target Target
	// Strategy is the routing strategy the decision was made under.
	Strategy string
	// Leaf marks a route to a leaf cluster (Cluster): the root decides
	// nothing more, the leaf's Router picks the node when DialHost asks
	// it, so Node and Candidates are empty.
	Leaf bool
	// LeafOpenSSH is the leaf's OpenSSH node a DialHost through a leaf
	// reached (the leaf says so; nil for a Postern node, which records
	// its own sessions): nothing records it unless the caller does.
	LeafOpenSSH *proxyapi.LeafOpenSSHNode
}

// AccessFilter says whether the caller's roles let them reach a node. It
// runs on the candidates before routing rules 1-5 decide (rule 5 in
// docs/reference.md, Routing), so a node the caller may not see is never chosen,
// named or counted: it cannot make an ambiguous error list it, turn a
// unique name ambiguous, or win most_recent over the node the caller may
// use. Nil means the admin view (`pctl route`): every node takes part.
type AccessFilter func(node services.Node) bool

// Route decides which node t means for a caller whose access is filter
// (nil: the admin view), following routing rules 0-5 (docs/reference.md,
// Routing; each is marked below).
// Errors: NotFound `node "HOST" not found in cluster "C"` and
// `cluster "C" not found`; *AmbiguousHostError (also a BadParameter) for
// several matches under unambiguous_match. On an ambiguous error the
// returned Route carries the candidates.
func (r *Router) Route(ctx context.Context, t Target, filter AccessFilter) (Route, error) {
	route, _, err := r.route(ctx, t, filter)
	return route, err
}

func (r *Router) route(ctx context.Context, t Target, filter AccessFilter) (Route, *services.ClusterNetworkingConfig, error) {
	start := r.cfg.Clock.Now()
	defer func() { r.metrics.routeDuration.Observe(r.cfg.Clock.Since(start).Seconds()) }()

	netCfg, err := r.cfg.Networking.GetClusterNetworkingConfig(ctx)
	if err != nil {
		return Route{}, nil, trace.Wrap(err, "reading cluster networking config")
	}
	res, err := r.resolve(t)
	if err != nil {
		return Route{}, netCfg, err
	}
	if res.leaf {
		return leafRoute(res, netCfg.Spec.RoutingStrategy), netCfg, nil
	}
	route, err := r.routeLocal(ctx, res, filter, netCfg)
	return route, netCfg, err
}

// routeLocal applies rules 1-5 to a target resolved to the local
// cluster, among the nodes filter lets through.
func (r *Router) routeLocal(ctx context.Context, res resolved, filter AccessFilter, netCfg *services.ClusterNetworkingConfig) (Route, error) {
	t := res.asked
	ci := netCfg.Spec.CaseInsensitiveRouting
	route := Route{Cluster: res.target.Cluster, Target: res.target, Strategy: netCfg.Spec.RoutingStrategy}
	prefix := res.suffixNote
	host := route.Target.Host

	matches, how, hidden, err := r.candidates(ctx, route.Cluster, host, t.Port, ci, filter)
	if err != nil {
		return Route{}, trace.Wrap(err)
	}
	if len(matches) == 0 && !ci {
		// OpenSSH lower-cases the host it is given (`ssh -J proxy
		// Web-Upper` opens direct-tcpip to "web-upper"), so a miss under
		// case-sensitive routing is retried case-insensitively. An exact
		// match always wins; the fallback only answers what would
		// otherwise be "not found", and is subject to the strategy like
		// any other several-node answer.
		var fbHidden []string
		matches, how, fbHidden, err = r.candidates(ctx, route.Cluster, host, t.Port, true, filter)
		if err != nil {
			return Route{}, trace.Wrap(err)
		}
		// The case-insensitive set contains the exact one.
		hidden = fbHidden
		if len(matches) > 0 {
			ci = true
			prefix += "no exact match; "
		}
	}
	route.Candidates = matches
	route.Hidden = hidden

	switch {
	case len(matches) == 0:
		// Rule 4.
		r.metrics.notFound.Inc()
		// A plain *trace.NotFoundError, without trace.NotFound's stack
		// capture: misses (typos, scanners) are common and must stay as
		// cheap as hits. trace.IsNotFound recognises it all the same.
		return route, nodeNotFound(t.Host, route.Cluster)
	case len(matches) == 1:
		route.Node = matches[0]
		route.Reason = prefix + "matched " + matchedBy(route.Node, host, how, ci) + portNote(t.Port)
		return route, nil
	case netCfg.Spec.RoutingStrategy == services.RoutingMostRecent:
		// Rule 5, most_recent: the latest heartbeat wins; ties go to the
		// smallest UUID so the choice is stable.
		best := matches[0]
		for _, n := range matches[1:] {
			if n.LastHeartbeat.After(best.LastHeartbeat) {
				best = n
			}
		}
		route.Node = best
		route.Reason = prefix + services.RoutingMostRecent + ": latest heartbeat (" + best.LastHeartbeat.UTC().Format(time.RFC3339) +
			") among " + strconv.Itoa(len(matches)) + " nodes matching " + quoteHost(t.Host) + portNote(t.Port)
		alts := make([]string, 0, len(matches)-1)
		for _, n := range matches {
			if n.UUID != best.UUID {
				alts = append(alts, n.UUID+"@"+n.LastHeartbeat.UTC().Format(time.RFC3339))
			}
		}
		r.cfg.Logger.WithFields(logrus.Fields{
			"host": t.Host, "cluster": route.Cluster, "chosen": best.UUID, "alternatives": alts,
		}).Info("Ambiguous host routed to the node with the latest heartbeat.")
		return route, nil
	default:
		// Rule 5, unambiguous_match.
		r.metrics.ambiguous.Inc()
		return route, &AmbiguousHostError{Host: t.Host, Cluster: route.Cluster, Candidates: matches}
	}
}

// candidates applies rules 1-3 to the nodes of cluster the caller may
// reach: how is "uuid" for a rule 1 match. hidden lists the UUIDs the
// same rules would have matched among the nodes filter refused (nil when
// there are none, so the common case allocates nothing more).
func (r *Router) candidates(ctx context.Context, cluster, host, port string, ci bool, filter AccessFilter) (visible []services.Node, how string, hidden []string, err error) {
	found, err := r.cfg.NodeWatcher.Find(ctx, services.NodeQuery{Cluster: cluster, Host: host, CaseInsensitive: ci})
	if err != nil {
		return nil, "", nil, trace.Wrap(err)
	}
	if filter == nil {
		visible, how = matchRules(found, host, port, ci)
		return visible, how, nil, nil
	}
	// Find returns copies: partition in place, visible first.
	var invisible []services.Node
	n := 0
	for i := range found {
		if filter(found[i]) {
			found[n], found[i] = found[i], found[n]
			n++
		}
	}
	found, invisible = found[:n], found[n:]
	visible, how = matchRules(found, host, port, ci)
	if len(invisible) > 0 {
		inv, _ := matchRules(invisible, host, port, ci)
		for _, h := range inv {
			hidden = append(hidden, h.UUID)
		}
	}
	return visible, how, hidden, nil
}

// matchRules applies rules 1-3 to what a finder returned. The finder's
// answer is re-checked here: rule 6 says only what matches is ever
// dialed, whatever a finder returns. The result is sorted by UUID.
func matchRules(matches []services.Node, host, port string, ci bool) ([]services.Node, string) {
	// Rule 1: a UUID match wins alone. Rule 2: otherwise hostname or
	// address host.
	how := "uuid"
	if i := slices.IndexFunc(matches, func(n services.Node) bool { return n.UUID == host }); i >= 0 {
		matches = matches[i : i+1]
	} else {
		how = ""
		canon := services.CanonicalAddrHost(host)
		matches = slices.DeleteFunc(matches, func(n services.Node) bool {
			return !hostnameEqual(n.Hostname, host, ci) && addrHostOf(n.Addr) != canon
		})
	}
	// Rule 3: ports.
	if !anyPort(port) {
		matches = slices.DeleteFunc(matches, func(n services.Node) bool { return addrPortOf(n.Addr) != port })
	}
	slices.SortFunc(matches, func(a, b services.Node) int { return strings.Compare(a.UUID, b.UUID) })
	return matches, how
}

func hostnameEqual(hostname, host string, caseInsensitive bool) bool {
	if caseInsensitive {
		return strings.EqualFold(hostname, host)
	}
	return hostname == host
}

// anyPort: empty and "0" mean any port, and so does 22, because that is
// what OpenSSH sends for `ssh -J proxy node` when no port was given.
func anyPort(p string) bool { return p == "" || p == "0" || p == "22" }

func addrHostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return services.CanonicalAddrHost(h)
}

func addrPortOf(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return p
}

func matchedBy(n services.Node, host, how string, ci bool) string {
	if how == "uuid" {
		return "uuid"
	}
	byName := hostnameEqual(n.Hostname, host, ci)
	byAddr := addrHostOf(n.Addr) == services.CanonicalAddrHost(host)
	switch {
	case byName && byAddr:
		return "hostname and address"
	case byName && ci && n.Hostname != host:
		return "hostname (case-insensitive)"
	case byName:
		return "hostname"
	}
	return "address"
}

func portNote(p string) string {
	if anyPort(p) {
		return ""
	}
	return " on port " + p
}

// nodeNotFound is rule 4's answer, and the answer to every caller whose
// access keeps a node from them: one sentence for both, so the two cannot
// be told apart.
func nodeNotFound(host, cluster string) error {
	return &trace.NotFoundError{Message: fmt.Sprintf("node %q not found in cluster %q", host, cluster)}
}

// HideDenied maps what Route or DialHost returned to what the caller may
// be told: a refusal by the caller's access (nodes the AccessFilter kept
// out, leaving none; or Authorize's trace.AccessDenied on the chosen node)
// reads exactly like a node that does not exist. denied reports such a
// refusal, so that the caller logs and audits the real cause; any other
// error is returned as is with denied false. Every user-facing path (the
// SSH proxy, the web terminal) answers through it.
func HideDenied(t Target, route Route, err error) (visible error, denied bool) {
	switch {
	case err == nil:
		return nil, false
	case trace.IsNotFound(err) && len(route.Hidden) > 0:
		return err, true
	case trace.IsAccessDenied(err):
		cluster := route.Cluster
		if cluster == "" {
			cluster = t.Cluster
		}
		return nodeNotFound(t.Host, cluster), true
	}
	return err, false
}

// NodeStatuses sets the Status of the OpenSSH nodes among entries (a
// listing of this cluster's nodes) from this proxy's health checker, the
// one whose answer the Router routes by: a node the list shows online is
// one a dial from here tries.
func (r *Router) NodeStatuses(entries []proxyapi.NodeEntry) {
	for i := range entries {
		e := &entries[i]
		if e.Kind != services.NodeKindOpenSSH {
			continue
		}
		e.Status = proxyapi.NodeOnline
		if r.cfg.Health != nil && !r.cfg.Health.Online(e.UUID) {
			e.Status = proxyapi.NodeOffline
		}
	}
}

// ClusterName is the local cluster's name.
func (r *Router) ClusterName() string { return r.cfg.ClusterName }
