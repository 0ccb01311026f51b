// Package proxy decides where a connection goes and opens it: the Router is
// shared by the SSH proxy (subsystem and direct-tcpip), the web terminal and
// `pctl route`, so the same target gets the same answer on every path.
//
// Routing is split in two. Route is a pure decision over the NodeWatcher's
// in-memory inventory, the caller's access filter and the live networking
// config: no network, so it is table-tested and explainable. DialHost runs
// Route and then dials exactly the chosen node's registered address,
// bounded by ssh_dial_timeout, and hands over the connection only once the
// node has answered as an SSH server.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
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
	// Clock times routing decisions and stamps Sites. Nil means the real
	// clock.
	Clock clockwork.Clock
	// Logger; nil means logrus with component "proxy:router".
	Logger logrus.FieldLogger
	// Metrics is where the router's metrics are registered; nil means a
	// private registry (metrics collected but not exported). Tests must
	// never pass prometheus.DefaultRegisterer.
	Metrics prometheus.Registerer
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
	// Locks, when set, refuses to dial a locked node (`pctl lock --node`)
	// with the lock's message; *services.LockWatcher is one. Nil means no
	// node locks.
	Locks NodeLocks
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
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = logrus.WithField("component", "proxy:router")
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
	}
	return nil
}

// Router routes targets to nodes. It is safe for concurrent use and meant
// to be constructed once per process.
type Router struct {
	cfg     RouterConfig
	metrics *routerMetrics
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
}

// AccessFilter says whether the caller's roles let them reach a node. It
// runs on the candidates before routing rules 1-5 decide (SPEC.md
// "Routing" rule 5), so a node the caller may not see is never chosen,
// named or counted: it cannot make an ambiguous error list it, turn a
// unique name ambiguous, or win most_recent over the node the caller may
// use. Nil means the admin view (`pctl route`): every node takes part.
type AccessFilter func(node services.Node) bool

// Route decides which node t means for a caller whose access is filter
// (nil: the admin view), following SPEC.md "Routing" rules 0-5.
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
	ci := netCfg.Spec.CaseInsensitiveRouting
	route := Route{Cluster: t.Cluster, Target: t, Strategy: netCfg.Spec.RoutingStrategy}
	if route.Cluster == "" {
		route.Cluster = r.cfg.ClusterName
		route.Target.Cluster = r.cfg.ClusterName
	}
	if !r.knowsCluster(route.Cluster) {
		r.metrics.notFound.Inc()
		return Route{}, netCfg, trace.NotFound("cluster %q not found", route.Cluster)
	}
	if t.Host == "" {
		return Route{}, netCfg, trace.BadParameter("missing host in target %q", t.String())
	}

	var prefix string
	// Rule 0: NAME.CLUSTER always means NAME in CLUSTER. There is no
	// exception for a node literally called NAME.CLUSTER: joins and
	// heartbeats refuse such hostnames, and an exception would let a node
	// capture the name `psh config` and host certificates rely on.
	if name, cluster, ok := r.splitClusterSuffix(t.Host); ok {
		prefix = t.Host + " resolved to " + name + " in cluster " + cluster + "; "
		route.Cluster = cluster
		route.Target.Host, route.Target.Cluster = name, cluster
	}
	host := route.Target.Host

	matches, how, hidden, err := r.candidates(ctx, route.Cluster, host, t.Port, ci, filter)
	if err != nil {
		return Route{}, netCfg, trace.Wrap(err)
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
			return Route{}, netCfg, trace.Wrap(err)
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
		return route, netCfg, nodeNotFound(t.Host, route.Cluster)
	case len(matches) == 1:
		route.Node = matches[0]
		route.Reason = prefix + "matched " + matchedBy(route.Node, host, how, ci) + portNote(t.Port)
		return route, netCfg, nil
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
		return route, netCfg, nil
	default:
		// Rule 5, unambiguous_match.
		r.metrics.ambiguous.Inc()
		return route, netCfg, &AmbiguousHostError{Host: t.Host, Cluster: route.Cluster, Candidates: matches}
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

// knowsCluster reports whether the proxy can route to cluster. Only the
// local cluster today; trusted clusters will add theirs.
func (r *Router) knowsCluster(cluster string) bool {
	return cluster == r.cfg.ClusterName
}

// splitClusterSuffix splits NAME.CLUSTER for a known CLUSTER. The suffix
// compares case-insensitively: OpenSSH lower-cases the host it is given,
// so `ssh web.MyCluster` arrives as "web.mycluster".
func (r *Router) splitClusterSuffix(host string) (name, cluster string, ok bool) {
	c := r.cfg.ClusterName
	if len(host) < len(c)+2 {
		return "", "", false
	}
	name, suffix := host[:len(host)-len(c)-1], host[len(host)-len(c)-1:]
	if suffix[0] != '.' || !strings.EqualFold(suffix[1:], c) {
		return "", "", false
	}
	return name, c, true
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

// RouteRequest is one DialHost call.
type RouteRequest struct {
	// Target is where the user wants to go.
	Target Target
	// Access is the caller's access filter, applied to the candidates
	// before routing decides (see AccessFilter). Every user-facing path
	// sets it; nil means the admin view.
	Access AccessFilter
	// Source is the client's address, passed to a tunnel node for its
	// audit log; empty when unknown.
	Source string
	// Authorize, when set, runs on the chosen node before anything is
	// dialed (the web terminal checks the exact login there). Its error
	// is returned as is and nothing is dialed.
	Authorize func(node services.Node) error
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

// DialHost routes req.Target and dials the chosen node's registered
// address, bounded by ssh_dial_timeout, then waits (as long again at
// most) for the node's SSH identification string: nothing that does not
// answer as an SSH server is ever handed to a caller to splice. The
// returned Route is filled in whenever routing got that far, also on
// error, for logs and audit.
func (r *Router) DialHost(ctx context.Context, req RouteRequest) (net.Conn, Route, error) {
	route, netCfg, err := r.route(ctx, req.Target, req.Access)
	if err != nil {
		// Already classified (NotFound, *AmbiguousHostError, ...); not
		// wrapped again so a miss stays cheap.
		return nil, route, err
	}
	if req.Authorize != nil {
		if err := req.Authorize(route.Node); err != nil {
			return nil, route, trace.Wrap(err)
		}
	}
	// After RBAC: only a user who may reach the node learns it is locked.
	if r.cfg.Locks != nil {
		if err := r.cfg.Locks.Check(services.LockTarget{Node: route.Node.UUID}); err != nil {
			return nil, route, trace.Wrap(err)
		}
	}
	// Dialer order (SPEC.md "Reverse tunnels", "Several proxies"): a
	// tunnel on this proxy, then a peer proxy holding one, then the
	// registered address, never for a tunnel-only node.
	node := route.Node
	timeout := netCfg.Spec.SSHDialTimeout.Value()
	if node.Tunnel || r.hasLocalTunnel(node.UUID) || len(r.peerHolders(node.UUID)) > 0 {
		conn, err := r.dialTunnel(ctx, req, node, netCfg)
		switch {
		case err == nil:
			checked, err := checkBanner(ctx, conn, timeout)
			if err != nil {
				conn.Close()
				r.metrics.dialFailures.Inc()
				return nil, route, trace.ConnectionProblem(err, "node %q did not answer as an SSH server over its tunnel", node.Hostname)
			}
			return checked, route, nil
		case node.Tunnel || node.Addr == "":
			return nil, route, err
		}
		// A node with an address whose tunnel could not be used: the
		// address is the last resort.
		r.cfg.Logger.WithError(err).WithField("node", node.UUID).Debug("Tunnel dial failed; dialing the registered address.")
	}
	// Rule 6: the only address ever dialed is a registered node's Addr.
	// The timeout is real time on purpose: it bounds a kernel connect(),
	// which a fake clock cannot speed up, and a net.Dialer reads the
	// context deadline as wall-clock time.
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := r.cfg.Dialer.DialContext(dctx, "tcp", node.Addr)
	if err != nil {
		r.metrics.dialFailures.Inc()
		if ctx.Err() != nil {
			return nil, route, trace.ConnectionProblem(err, "dialing node %q (%s) canceled: %v", node.Hostname, node.Addr, context.Cause(ctx))
		}
		if errors.Is(dctx.Err(), context.DeadlineExceeded) {
			return nil, route, trace.ConnectionProblem(err, "dialing node %q (%s) timed out after %v", node.Hostname, node.Addr, timeout)
		}
		return nil, route, trace.ConnectionProblem(err, "failed to dial node %q (%s): %v", node.Hostname, node.Addr, err)
	}
	checked, err := checkBanner(ctx, conn, timeout)
	if err != nil {
		conn.Close()
		r.metrics.dialFailures.Inc()
		r.cfg.Logger.WithFields(logrus.Fields{"node": node.UUID, "addr": node.Addr}).WithError(err).Warn("Node did not answer as an SSH server; not relaying.")
		if ctx.Err() != nil {
			return nil, route, trace.ConnectionProblem(err, "dialing node %q (%s) canceled: %v", node.Hostname, node.Addr, context.Cause(ctx))
		}
		return nil, route, trace.ConnectionProblem(err, "node %q (%s) did not answer as an SSH server", node.Hostname, node.Addr)
	}
	return checked, route, nil
}

// Results of a tunnel dial, the postern_tunnel_routing_duration_seconds
// label.
const (
	resultFound    = "found"
	resultTimeout  = "timeout"
	resultCanceled = "canceled"
)

func (r *Router) hasLocalTunnel(uuid string) bool {
	return r.cfg.Tunnels != nil && r.cfg.Tunnels.HasTunnel(uuid)
}

func (r *Router) peerHolders(uuid string) []string {
	if r.cfg.Peers == nil {
		return nil
	}
	return r.cfg.Peers.PeerHolders(uuid)
}

// dialTunnel dials node over a tunnel: one on this proxy first, else
// through a peer proxy that holds one, waiting up to tunnel_find_timeout
// (on the Router's clock) for either to appear: a node reconnecting after
// a proxy restart, here or elsewhere, must not fail the sessions opened
// meanwhile. The wait blocks on the tunnel registry's and the tunnel
// locator's channels, not a poll. A node with an address does not wait:
// its address is the next choice.
func (r *Router) dialTunnel(ctx context.Context, req RouteRequest, node services.Node, netCfg *services.ClusterNetworkingConfig) (net.Conn, error) {
	timeout := netCfg.Spec.TunnelFindTimeout.Value()
	// SPEC.md's sentence, whether or not peers were asked ("this proxy"
	// is where the user's connection is); what a peer answered follows.
	offline := func(last error) error {
		if last != nil {
			return trace.ConnectionProblem(last, "node %q is offline: no tunnel reached this proxy within %v (peers: %v)", req.Target.Host, timeout, trace.UserMessage(last))
		}
		return trace.ConnectionProblem(nil, "node %q is offline: no tunnel reached this proxy within %v", req.Target.Host, timeout)
	}
	if r.cfg.Tunnels == nil && r.cfg.Peers == nil {
		return nil, offline(nil)
	}
	start := r.cfg.Clock.Now()
	observe := func(result string) {
		r.metrics.tunnelRouting.WithLabelValues(result).Observe(r.cfg.Clock.Since(start).Seconds())
	}
	deadline := r.cfg.Clock.NewTimer(timeout)
	defer deadline.Stop()
	dst := req.Target.Host
	if req.Target.Port != "" {
		dst = net.JoinHostPort(req.Target.Host, req.Target.Port)
	}
	src := req.Source
	if src == "" {
		src = utils.ClientAddr(ctx)
	}
	var last error
	for {
		var registered, located <-chan struct{}
		if r.cfg.Tunnels != nil {
			registered = r.cfg.Tunnels.TunnelRegistered(node.UUID)
		}
		if r.cfg.Peers != nil {
			located = r.cfg.Peers.PeerLocated(node.UUID)
		}
		if r.hasLocalTunnel(node.UUID) {
			conn, err := r.cfg.Tunnels.DialTunnel(ctx, node.UUID, src, dst)
			if err == nil {
				observe(resultFound)
				return conn, nil
			}
			if !trace.IsNotFound(err) {
				r.metrics.dialFailures.Inc()
				observe(resultCanceled)
				return nil, trace.Wrap(err)
			}
			// The tunnel went away in between: look at peers, then wait.
		}
		if holders := r.peerHolders(node.UUID); len(holders) > 0 {
			conn, peer, err := r.dialPeers(ctx, holders, node.UUID, src, dst)
			if err == nil {
				observe(resultFound)
				r.cfg.Logger.WithFields(logrus.Fields{"node": node.UUID, "peer": peer}).Debug("Dialed through a peer proxy.")
				return conn, nil
			}
			last = err
			if ctx.Err() != nil {
				observe(resultCanceled)
				return nil, trace.ConnectionProblem(context.Cause(ctx), "dialing node %q canceled: %v", req.Target.Host, context.Cause(ctx))
			}
			// Stale leases or unreachable peers: wait for the next
			// lease or a tunnel here, within the same deadline.
		}
		if !node.Tunnel {
			return nil, offline(last)
		}
		select {
		case <-registered:
		case <-located:
		case <-deadline.Chan():
			observe(resultTimeout)
			r.metrics.tunnelTimeouts.Inc()
			r.cfg.Logger.WithFields(logrus.Fields{"node": node.UUID, "timeout": timeout.String()}).Warn("No tunnel from the node reached this proxy or a peer in time.")
			return nil, offline(last)
		case <-ctx.Done():
			observe(resultCanceled)
			return nil, trace.ConnectionProblem(context.Cause(ctx), "dialing node %q canceled while waiting for its tunnel: %v", req.Target.Host, context.Cause(ctx))
		}
	}
}

// dialPeers dials node through every candidate peer at once (at most
// maxPeerCandidates): the first to connect wins, the others are canceled
// and any that connected anyway are closed. It returns once every attempt
// has ended, so nothing it started outlives it.
func (r *Router) dialPeers(ctx context.Context, holders []string, node, source, dst string) (net.Conn, string, error) {
	if len(holders) > maxPeerCandidates {
		holders = holders[:maxPeerCandidates]
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		conn net.Conn
		peer string
		err  error
	}
	results := make(chan result, len(holders))
	for _, h := range holders {
		go func() {
			conn, err := r.cfg.Peers.DialPeer(ctx, h, node, source, dst)
			results <- result{conn, h, err}
		}()
	}
	var won result
	var errs []error
	for range holders {
		res := <-results
		switch {
		case res.err != nil:
			errs = append(errs, res.err)
		case won.conn == nil:
			won = res
			cancel()
		default:
			res.conn.Close()
		}
	}
	if won.conn != nil {
		return won.conn, won.peer, nil
	}
	r.metrics.dialFailures.Inc()
	return nil, "", trace.NewAggregate(errs...)
}

// Via says how DialHost would reach node now: over a tunnel on this
// proxy, through a peer proxy that holds one, by waiting for one, or at
// its registered address.
func (r *Router) Via(node services.Node) string {
	holders := r.peerHolders(node.UUID)
	switch {
	case r.hasLocalTunnel(node.UUID):
		return "tunnel on this proxy"
	case len(holders) > 0 && node.Tunnel && r.cfg.Tunnels == nil:
		// pctl route: no tunnels of its own, every holder is a peer.
		return "its reverse tunnel (a tunnel-only node: never dialed directly), via peer " + strings.Join(holders, ", ")
	case len(holders) > 0:
		return "via peer " + strings.Join(holders, ", ") + " (its tunnel is on that proxy)"
	case node.Tunnel && r.cfg.Peers != nil:
		return "tunnel (none on this proxy or a peer now: a dial waits tunnel_find_timeout for one)"
	case node.Tunnel && r.cfg.Tunnels != nil:
		return "tunnel (none on this proxy now: a dial waits tunnel_find_timeout for one)"
	case node.Tunnel:
		return "its reverse tunnel (a tunnel-only node: never dialed directly)"
	}
	return "registered address " + node.Addr
}

// Sites lists the clusters this proxy routes to: the local one, always
// online (trusted clusters will add theirs with their tunnel state).
func (r *Router) Sites(ctx context.Context) []proxyapi.Site {
	return []proxyapi.Site{{Name: r.cfg.ClusterName, Status: proxyapi.SiteOnline, LastConnected: r.cfg.Clock.Now().UTC()}}
}

// ClusterName is the local cluster's name.
func (r *Router) ClusterName() string { return r.cfg.ClusterName }
