package proxy

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

const testCluster = "c1"

// t0 is the fake "now" of routing tests.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type routerEnv struct {
	store   *services.Store
	watcher *services.NodeWatcher
	router  *Router
	clock   *clockwork.FakeClock
	reg     *prometheus.Registry
}

// newRouterEnv runs a real NodeWatcher over the memory backend. Node
// expiry is decided by the watcher's fake clock; the backend gets its own
// clock so that it never sweeps under the test.
func newRouterEnv(t testing.TB, nodes []services.Node, dialer Dialer) *routerEnv {
	t.Helper()
	return newRouterEnvWith(t, nodes, func(c *RouterConfig) { c.Dialer = dialer })
}

// newRouterEnvWith is newRouterEnv with the router's config adjusted by
// mutate.
func newRouterEnvWith(t testing.TB, nodes []services.Node, mutate func(*RouterConfig)) *routerEnv {
	t.Helper()
	ctx := context.Background()
	b, err := memory.New(memory.Config{Clock: clockwork.NewFakeClockAt(t0)})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	store := services.NewStore(b)
	for _, n := range nodes {
		require.NoError(t, store.UpsertNode(ctx, n))
	}
	clock := clockwork.NewFakeClockAt(t0)
	w, err := services.NewNodeWatcher(services.NodeWatcherConfig{Events: store.NodeEvents(), Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	require.NoError(t, w.WaitSynced(ctx))
	reg := prometheus.NewRegistry()
	cfg := RouterConfig{ClusterName: testCluster, NodeWatcher: w, Networking: store, Deps: observe.Deps{Clock: clock, Metrics: reg}}
	mutate(&cfg)
	r, err := NewRouter(cfg)
	require.NoError(t, err)
	return &routerEnv{store: store, watcher: w, router: r, clock: clock, reg: reg}
}

func (e *routerEnv) setNetworking(t testing.TB, strategy string, caseInsensitive bool, timeout time.Duration) {
	t.Helper()
	require.NoError(t, e.store.SetClusterNetworkingConfig(context.Background(), &services.ClusterNetworkingConfig{
		Spec: services.ClusterNetworkingConfigSpec{RoutingStrategy: strategy, CaseInsensitiveRouting: caseInsensitive, SSHDialTimeout: services.Duration(timeout)},
	}))
}

func (e *routerEnv) counter(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func node(uuid, hostname, addr string, heartbeatAgo time.Duration, labels ...string) services.Node {
	n := services.Node{UUID: uuid, Hostname: hostname, Addr: addr, Cluster: testCluster,
		LastHeartbeat: t0.Add(-heartbeatAgo), Expires: t0.Add(10*time.Minute - heartbeatAgo)}
	if len(labels) > 0 {
		n.Labels = map[string]string{}
		for i := 0; i+1 < len(labels); i += 2 {
			n.Labels[labels[i]] = labels[i+1]
		}
	}
	return n
}

// routingNodes is the inventory of the table tests.
func routingNodes() []services.Node {
	return []services.Node{
		node("u1", "web", "10.0.0.1:3022", 0, "env", "prod", "app", "shop"),
		node("u2", "Web", "10.0.0.2:3022", 0),
		node("u3", "db", "[2001:db8::5]:3022", 0),
		node("u4", "api", "10.0.0.4:22", time.Minute, "env", "prod"),
		node("u5", "api", "10.0.0.5:3022", 2*time.Minute, "env", "staging"),
		node("u6", "web.c1", "10.0.0.6:3022", 0),
		node("u7", "cache", "10.0.0.7:3022", 0),
		node("u8", "u1", "10.0.0.8:3022", 0), // a hostname equal to another node's uuid
		// A recycled hostname: the old node stopped heartbeating 5 minutes
		// ago but has not expired yet; the new one just heartbeated.
		node("u9", "build", "10.0.0.9:3022", 5*time.Minute),
		node("u10", "build", "10.0.0.10:3022", 10*time.Second),
		node("u11", "10.0.0.4", "10.0.0.11:3022", 0), // a hostname equal to another node's address
		node("u12", "Web-Upper", "10.0.0.12:3022", 0),
	}
}

// TestRoute walks the routing rules. Every case gets its own inventory,
// watcher and networking config, so no case depends on another's settings
// or on the order they run in; and every case states what it expects: the
// node and the exact reason, or the exact error.
func TestRoute(t *testing.T) {
	ctx := context.Background()
	type tc struct {
		target string
		// cluster is set on the parsed target.
		cluster string
		strat   string
		ci      bool
		want    string // chosen uuid
		reason  string // exact Reason of the chosen route
		err     string // exact error, when routing fails
		isErr   func(error) bool
	}
	notFound, ambiguous := trace.IsNotFound, IsAmbiguousHost
	for _, c := range []tc{
		// Rule 1: uuid wins alone, even over a node whose hostname is u1.
		{target: "u1", want: "u1", reason: "matched uuid"},
		{target: "u1:3022", want: "u1", reason: "matched uuid on port 3022"},
		{target: "u1:2222", err: `node "u1" not found in cluster "c1"`, isErr: notFound},
		// Rule 2: hostname, case-sensitive by default.
		{target: "web", want: "u1", reason: "matched hostname"},
		{target: "Web", want: "u2", reason: "matched hostname"},
		// No exact match: the case-insensitive fallback (OpenSSH
		// lower-cases hosts), subject to the strategy.
		{target: "WEB", err: "ambiguous host \"WEB\" matches 2 nodes in cluster \"c1\"; connect by UUID instead:\n" +
			"  u1 addr=10.0.0.1:3022 labels=app=shop,env=prod last_heartbeat=2026-11-30T12:00:00Z\n" +
			"  u2 addr=10.0.0.2:3022 labels=- last_heartbeat=2026-11-30T12:00:00Z", isErr: ambiguous},
		{target: "WEB", strat: services.RoutingMostRecent, want: "u1", reason: `no exact match; most_recent: latest heartbeat (2026-11-30T12:00:00Z) among 2 nodes matching "WEB"`},
		{target: "web-upper", want: "u12", reason: "no exact match; matched hostname (case-insensitive)"},
		{target: "web-upper:22", want: "u12", reason: "no exact match; matched hostname (case-insensitive)"},
		{target: "web-upper:2222", err: `node "web-upper" not found in cluster "c1"`, isErr: notFound},
		{target: "web-upper.c1", want: "u12", reason: "web-upper.c1 resolved to web-upper in cluster c1; no exact match; matched hostname (case-insensitive)"},
		{target: "Web-Upper", want: "u12", reason: "matched hostname"},
		{target: "WEB", ci: true, err: "ambiguous host \"WEB\" matches 2 nodes in cluster \"c1\"; connect by UUID instead:\n" +
			"  u1 addr=10.0.0.1:3022 labels=app=shop,env=prod last_heartbeat=2026-11-30T12:00:00Z\n" +
			"  u2 addr=10.0.0.2:3022 labels=- last_heartbeat=2026-11-30T12:00:00Z", isErr: ambiguous},
		{target: "WEB:3022", ci: true, strat: services.RoutingMostRecent, want: "u1", reason: `most_recent: latest heartbeat (2026-11-30T12:00:00Z) among 2 nodes matching "WEB" on port 3022`},
		{target: "DB", ci: true, want: "u3", reason: "matched hostname (case-insensitive)"},
		// Rule 2: address host, IPv4 and IPv6 in any spelling.
		{target: "10.0.0.5", want: "u5", reason: "matched address"},
		{target: "2001:db8::5", want: "u3", reason: "matched address"},
		{target: "[2001:db8:0::5]:3022", want: "u3", reason: "matched address on port 3022"},
		{target: "[2001:db8::5]:22", want: "u3", reason: "matched address"},
		// A hostname equal to another node's address host: both match.
		{target: "10.0.0.4", err: "ambiguous host \"10.0.0.4\" matches 2 nodes in cluster \"c1\"; connect by UUID instead:\n" +
			"  u11 addr=10.0.0.11:3022 labels=- last_heartbeat=2026-11-30T12:00:00Z\n" +
			"  u4 addr=10.0.0.4:22 labels=env=prod last_heartbeat=2026-11-30T11:59:00Z", isErr: ambiguous},
		// Rule 3: ports. "", "0" and "22" mean any port.
		{target: "web:3022", want: "u1", reason: "matched hostname on port 3022"},
		{target: "web:0", want: "u1", reason: "matched hostname"},
		{target: "web:22", want: "u1", reason: "matched hostname"},
		{target: "web:2222", err: `node "web" not found in cluster "c1"`, isErr: notFound},
		{target: "api", err: "ambiguous host \"api\" matches 2 nodes in cluster \"c1\"; connect by UUID instead:\n" +
			"  u4 addr=10.0.0.4:22 labels=env=prod last_heartbeat=2026-11-30T11:59:00Z\n" +
			"  u5 addr=10.0.0.5:3022 labels=env=staging last_heartbeat=2026-11-30T11:58:00Z", isErr: ambiguous},
		{target: "api:22", isErr: ambiguous, err: "ambiguous host \"api\" matches 2 nodes in cluster \"c1\"; connect by UUID instead:\n" +
			"  u4 addr=10.0.0.4:22 labels=env=prod last_heartbeat=2026-11-30T11:59:00Z\n" +
			"  u5 addr=10.0.0.5:3022 labels=env=staging last_heartbeat=2026-11-30T11:58:00Z"},
		{target: "api:3022", want: "u5", reason: "matched hostname on port 3022"},
		// Rule 5: most_recent picks the latest heartbeat.
		{target: "api", strat: services.RoutingMostRecent, want: "u4", reason: `most_recent: latest heartbeat (2026-11-30T11:59:00Z) among 2 nodes matching "api"`},
		{target: "build", strat: services.RoutingMostRecent, want: "u10", reason: `most_recent: latest heartbeat (2026-11-30T11:59:50Z) among 2 nodes matching "build"`},
		{target: "build", err: "ambiguous host \"build\" matches 2 nodes in cluster \"c1\"; connect by UUID instead:\n" +
			"  u10 addr=10.0.0.10:3022 labels=- last_heartbeat=2026-11-30T11:59:50Z\n" +
			"  u9 addr=10.0.0.9:3022 labels=- last_heartbeat=2026-11-30T11:55:00Z", isErr: ambiguous},
		// Rule 0: NAME.CLUSTER.
		{target: "cache.c1", want: "u7", reason: "cache.c1 resolved to cache in cluster c1; matched hostname"},
		{target: "cache.C1:3022", want: "u7", reason: "cache.C1 resolved to cache in cluster c1; matched hostname on port 3022"},
		{target: "u3.c1", want: "u3", reason: "u3.c1 resolved to u3 in cluster c1; matched uuid"},
		// No literal exception: NAME.CLUSTER always means NAME in
		// CLUSTER, even with a node (refused at join nowadays) literally
		// called web.c1.
		{target: "web.c1", want: "u1", reason: "web.c1 resolved to web in cluster c1; matched hostname"},
		{target: "web.C1", want: "u1", reason: "web.C1 resolved to web in cluster c1; matched hostname"},
		{target: "web.c1.c1", want: "u6", reason: "web.c1.c1 resolved to web.c1 in cluster c1; matched hostname"},
		{target: "WEB.C1", ci: true, err: "ambiguous host \"WEB.C1\" matches 2 nodes in cluster \"c1\"; connect by UUID instead:\n" +
			"  u1 addr=10.0.0.1:3022 labels=app=shop,env=prod last_heartbeat=2026-11-30T12:00:00Z\n" +
			"  u2 addr=10.0.0.2:3022 labels=- last_heartbeat=2026-11-30T12:00:00Z", isErr: ambiguous},
		{target: "cache.c2", err: `node "cache.c2" not found in cluster "c1"`, isErr: notFound},
		{target: ".c1", err: `node ".c1" not found in cluster "c1"`, isErr: notFound},
		// Rule 4 and clusters.
		{target: "nope", err: `node "nope" not found in cluster "c1"`, isErr: notFound},
		{target: "web", cluster: "c1", want: "u1", reason: "matched hostname"},
		{target: "web", cluster: "c2", err: `cluster "c2" not found`, isErr: notFound},
	} {
		name := c.target + "/" + c.strat
		if c.ci {
			name += "/ci"
		}
		if c.cluster != "" {
			name += "/cluster=" + c.cluster
		}
		t.Run(name, func(t *testing.T) {
			if c.want != "" {
				require.NotEmpty(t, c.reason, "the case must state the route's reason")
				require.Empty(t, c.err, "a case expects a route or an error, not both")
			} else {
				require.NotEmpty(t, c.err, "the case must state the exact error")
				require.NotNil(t, c.isErr, "the case must state the error's class")
				require.Empty(t, c.reason, "a failed route has no reason")
			}
			strat := c.strat
			if strat == "" {
				strat = services.RoutingUnambiguousMatch
			}
			env := newRouterEnv(t, routingNodes(), nil)
			env.setNetworking(t, strat, c.ci, 0)
			tgt, err := ParseTarget(c.target)
			require.NoError(t, err)
			tgt.Cluster = c.cluster
			route, err := env.router.Route(ctx, tgt, nil)
			if c.want == "" {
				require.Error(t, err)
				require.Equal(t, c.err, err.Error())
				require.True(t, c.isErr(err), "%T %v", err, err)
				require.Zero(t, route.Node)
				require.Empty(t, route.Reason)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, route.Node.UUID)
			require.Equal(t, c.reason, route.Reason)
			require.Equal(t, strat, route.Strategy)
			require.Equal(t, testCluster, route.Cluster)
			require.Contains(t, uuidsOf(route.Candidates), c.want)
		})
	}
}

func uuidsOf(nodes []services.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.UUID)
	}
	return out
}

func TestAmbiguousHostError(t *testing.T) {
	env := newRouterEnv(t, routingNodes(), nil)
	route, err := env.router.Route(context.Background(), Target{Host: "api"}, nil)
	require.True(t, trace.IsBadParameter(err), "ambiguous is a bad parameter")
	require.True(t, IsAmbiguousHost(err))
	require.False(t, trace.IsNotFound(err))
	require.Equal(t, []string{"u4", "u5"}, uuidsOf(route.Candidates))
	require.Equal(t, err.Error(), trace.UserMessage(err))
	require.False(t, IsAmbiguousHost(trace.BadParameter("x")))
	require.Equal(t, 1.0, env.counter(t, "postern_proxy_route_ambiguous_total"))
	_, err = env.router.Route(context.Background(), Target{Host: "nope"}, nil)
	require.Error(t, err)
	require.Equal(t, 1.0, env.counter(t, "postern_proxy_route_not_found_total"))
	require.Equal(t, 2.0, env.counter(t, "postern_proxy_route_duration_seconds"))
}

func TestRouteExpiredNode(t *testing.T) {
	env := newRouterEnv(t, routingNodes(), nil)
	ctx := context.Background()
	env.setNetworking(t, services.RoutingUnambiguousMatch, false, 0)
	_, err := env.router.Route(ctx, Target{Host: "build"}, nil)
	require.True(t, IsAmbiguousHost(err))
	// The old "build" (heartbeat 5 minutes ago, TTL 10 minutes) expires
	// 5 minutes from t0; from then on the name is unambiguous.
	env.clock.Advance(5 * time.Minute)
	route, err := env.router.Route(ctx, Target{Host: "build"}, nil)
	require.NoError(t, err)
	require.Equal(t, "u10", route.Node.UUID)
}

func TestRouteNetworkingChangesApplyLive(t *testing.T) {
	env := newRouterEnv(t, routingNodes(), nil)
	ctx := context.Background()
	_, err := env.router.Route(ctx, Target{Host: "build"}, nil)
	require.True(t, IsAmbiguousHost(err), "default strategy is unambiguous_match")
	env.setNetworking(t, services.RoutingMostRecent, false, 0)
	route, err := env.router.Route(ctx, Target{Host: "build"}, nil)
	require.NoError(t, err)
	require.Equal(t, "u10", route.Node.UUID)
	require.Equal(t, services.RoutingMostRecent, route.Strategy)
}

// recordingDialer dials for real, except that addresses in hang block until
// the context ends (a node that never answers, without any outside
// address), and remembers every address it was asked for.
type recordingDialer struct {
	mu     sync.Mutex
	dialed []string
	hang   map[string]bool
}

func (d *recordingDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, addr)
	hang := d.hang[addr]
	d.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

func (d *recordingDialer) addrs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dialed...)
}

func TestDialHost(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("SSH-2.0-test\r\n"))
	})

	refusedAddr := freeport.RefusedAddr(t)

	dead := "127.0.0.1:9" // never dialed for real: the dialer hangs on it
	dialer := &recordingDialer{hang: map[string]bool{dead: true}}
	env := newRouterEnv(t, []services.Node{
		node("live", "live", ln.Addr().String(), 0),
		node("gone", "gone", refusedAddr, 0),
		node("dead", "dead", dead, 0),
		node("locked", "locked", "127.0.0.1:7", 0),
	}, dialer)
	env.setNetworking(t, services.RoutingUnambiguousMatch, false, 200*time.Millisecond)

	conn, route, err := env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "live", Port: "22"}})
	require.NoError(t, err)
	require.Equal(t, "live", route.Node.UUID)
	banner, err := io.ReadAll(conn)
	require.NoError(t, err)
	require.Equal(t, "SSH-2.0-test\r\n", string(banner))
	conn.Close()

	_, _, err = env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "gone"}})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.Contains(t, err.Error(), `failed to dial node "gone" (`+refusedAddr+`)`)

	start := time.Now()
	_, route, err = env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "dead"}})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.Equal(t, `dialing node "dead" (127.0.0.1:9) timed out after 200ms`, err.Error())
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, "dead", route.Node.UUID)

	// Authorization runs before any dial.
	_, _, err = env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "locked"}, Authorize: func(n services.Node) error {
		return trace.AccessDenied("access to node %q denied", n.Hostname)
	}})
	require.True(t, trace.IsAccessDenied(err))

	// Routing failures dial nothing; only registered addresses were dialed.
	_, _, err = env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "127.0.0.1", Port: "8080"}})
	require.True(t, trace.IsNotFound(err))
	require.Equal(t, []string{ln.Addr().String(), refusedAddr, dead}, dialer.addrs())
	require.Equal(t, 2.0, env.counter(t, "postern_proxy_dial_failures_total"))

	// A caller's cancellation is reported as such, not as a timeout.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = env.router.DialHost(cctx, RouteRequest{Target: Target{Host: "dead"}})
	require.True(t, trace.IsConnectionProblem(err))
	require.Contains(t, err.Error(), "canceled")
}

func TestDialHostDefaultDialer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("SSH-2.0-test\r\n"))
		}
		accepted <- c
	}()
	env := newRouterEnv(t, []services.Node{node("n1", "n1", ln.Addr().String(), 0)}, nil)
	conn, _, err := env.router.DialHost(context.Background(), RouteRequest{Target: Target{Host: "n1"}})
	require.NoError(t, err)
	srv := <-accepted
	require.NotNil(t, srv)
	srv.Close()
	conn.Close()
}

func TestSitesAndExplain(t *testing.T) {
	env := newRouterEnv(t, routingNodes(), nil)
	ctx := context.Background()
	sites := env.router.Sites(ctx, nil)
	require.Equal(t, []proxyapi.Site{{Name: testCluster, Status: "online", LastConnected: t0}}, sites)

	route, err := env.router.Route(ctx, Target{Host: "cache.c1", Port: "3022"}, nil)
	require.NoError(t, err)
	out := Explain(route)
	require.Contains(t, out, "target:     cache:3022@c1")
	require.Contains(t, out, "* cache u7 addr=10.0.0.7:3022")
	require.Contains(t, out, "chosen:     u7 (cache, 10.0.0.7:3022)")
	require.Contains(t, out, "reason:     cache.c1 resolved to cache in cluster c1; matched hostname on port 3022")

	e := env.router.ExplainTarget(ctx, Target{Host: "cache.c1", Port: "3022"})
	require.Equal(t, "cache.c1:3022", e.Target)
	require.Equal(t, "cache:3022@c1", e.Resolved)
	require.Equal(t, "u7", e.Chosen.UUID)
	require.Empty(t, e.Error)

	e = env.router.ExplainTarget(ctx, Target{Host: "api"})
	require.Nil(t, e.Chosen)
	require.Equal(t, []string{"u4", "u5"}, uuidsOf(e.Candidates))
	require.True(t, strings.HasPrefix(e.Error, `ambiguous host "api" matches 2 nodes`))
	require.Contains(t, e.String(), "error:      ambiguous host")
	require.Contains(t, e.String(), "\n              u5 addr=10.0.0.5:3022")

	e = env.router.ExplainTarget(ctx, Target{Host: "nope", Cluster: "x"})
	require.Equal(t, `cluster "x" not found`, e.Error)
	require.Equal(t, "x", e.Cluster)
	require.Contains(t, e.String(), "candidates: none")
}

func TestNewRouterConfig(t *testing.T) {
	_, err := NewRouter(RouterConfig{})
	require.True(t, trace.IsBadParameter(err))
	env := newRouterEnv(t, nil, nil)
	// A second router on the same registry shares the metrics.
	r2, err := NewRouter(RouterConfig{ClusterName: testCluster, NodeWatcher: env.watcher, Networking: env.store, Deps: observe.Deps{Metrics: env.reg}})
	require.NoError(t, err)
	_, err = r2.Route(context.Background(), Target{Host: "x"}, nil)
	require.True(t, trace.IsNotFound(err))
	require.Equal(t, 1.0, env.counter(t, "postern_proxy_route_not_found_total"))
}
