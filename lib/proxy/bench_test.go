package proxy

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// benchSizes are the cluster sizes routing is measured at: its cost must
// not grow with them.
var benchSizes = []int{1000, 10000, 100000}

func benchNode(i int) services.Node {
	return services.Node{
		UUID:          fmt.Sprintf("%08d-0000-4000-8000-000000000000", i),
		Hostname:      fmt.Sprintf("host-%d", i),
		Addr:          fmt.Sprintf("10.%d.%d.%d:3022", i>>16&255, i>>8&255, i&255),
		Cluster:       testCluster,
		Labels:        map[string]string{"env": "prod", "rack": fmt.Sprintf("r%d", i%64)},
		LastHeartbeat: t0,
	}
}

// benchStore loads n nodes into a memory backend (keys in ascending order,
// so the sorted slice only appends).
func benchStore(tb testing.TB, n int) (*services.Store, func()) {
	tb.Helper()
	b, err := memory.New(memory.Config{Clock: clockwork.NewFakeClockAt(t0)})
	require.NoError(tb, err)
	s := services.NewStore(b)
	ctx := context.Background()
	for i := range n {
		require.NoError(tb, s.UpsertNode(ctx, benchNode(i)))
	}
	// Written explicitly, as a deployed cluster has it: an unset config
	// makes every read a backend NotFound, whose stack capture would
	// dominate the benchmark.
	require.NoError(tb, s.SetClusterNetworkingConfig(ctx, services.DefaultClusterNetworkingConfig()))
	return s, func() { b.Close() }
}

func benchWatcher(tb testing.TB, s *services.Store) *services.NodeWatcher {
	tb.Helper()
	w, err := services.NewNodeWatcher(services.NodeWatcherConfig{Events: s.NodeEvents(), Clock: clockwork.NewFakeClockAt(t0)})
	require.NoError(tb, err)
	require.NoError(tb, w.WaitSynced(context.Background()))
	return w
}

func benchRouter(tb testing.TB, s NetworkingGetter, w *services.NodeWatcher) *Router {
	tb.Helper()
	r, err := NewRouter(RouterConfig{ClusterName: testCluster, NodeWatcher: w, Networking: s,
		Deps: observe.Deps{Clock: clockwork.NewRealClock(), Metrics: prometheus.NewRegistry()},
	})
	require.NoError(tb, err)
	return r
}

// benchTargets is a fixed mix of lookups: 3 hits (by hostname) for every
// miss, spread over the whole cluster.
func benchTargets(n int) []Target {
	targets := make([]Target, 1024)
	for i := range targets {
		if i%4 == 3 {
			targets[i] = Target{Host: fmt.Sprintf("missing-%d", i), Port: "22"}
			continue
		}
		targets[i] = Target{Host: fmt.Sprintf("host-%d", (i*7919)%n), Port: "22"}
	}
	return targets
}

func BenchmarkRoute(b *testing.B) {
	benchmarkRoute(b, false)
}

// BenchmarkRouteNetworkingWatcher is BenchmarkRoute with the networking
// config served from memory by a services.NetworkingWatcher.
func BenchmarkRouteNetworkingWatcher(b *testing.B) {
	benchmarkRoute(b, true)
}

func benchmarkRoute(b *testing.B, netWatcher bool) {
	for _, n := range benchSizes {
		s, closeStore := benchStore(b, n)
		w := benchWatcher(b, s)
		var ng NetworkingGetter = s
		closeNW := func() {}
		if netWatcher {
			nw, err := services.NewNetworkingWatcher(services.NetworkingWatcherConfig{Events: s})
			require.NoError(b, err)
			closeNW = func() { nw.Close() }
			ng = nw
		}
		r := benchRouter(b, ng, w)
		targets := benchTargets(n)
		ctx := context.Background()
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				t := targets[i%len(targets)]
				_, err := r.Route(ctx, t, nil)
				if (err == nil) != (i%4 != 3) {
					b.Fatalf("target %v: %v", t, err)
				}
				i++
			}
		})
		closeNW()
		w.Close()
		closeStore()
	}
}

// BenchmarkFind isolates the NodeWatcher lookup (no networking-config read,
// no error construction): the part whose cost must not depend on n.
func BenchmarkFind(b *testing.B) {
	for _, n := range benchSizes {
		s, closeStore := benchStore(b, n)
		w := benchWatcher(b, s)
		targets := benchTargets(n)
		ctx := context.Background()
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				t := targets[i%len(targets)]
				if _, err := w.Find(ctx, services.NodeQuery{Cluster: testCluster, Host: t.Host}); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		w.Close()
		closeStore()
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkNodeWatcherHeap reports the heap a NodeWatcher holds for n nodes
// (the backend's own copy is loaded before the first measurement). Run it
// with -benchtime=1x: each iteration builds a watcher from scratch.
func BenchmarkNodeWatcherHeap(b *testing.B) {
	for _, n := range benchSizes {
		s, closeStore := benchStore(b, n)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			var perNode float64
			for b.Loop() {
				before := heapInUse()
				w := benchWatcher(b, s)
				after := heapInUse()
				require.Equal(b, n, w.Len())
				perNode = float64(after-before) / float64(n)
				b.ReportMetric(float64(after-before)/(1<<20), "heap-MB")
				w.Close()
			}
			b.ReportMetric(perNode, "heap-B/node")
		})
		closeStore()
	}
}

// BenchmarkRouteConcurrent1000 runs 1,000 route lookups at once and reports
// the heap they hold while all are in flight (each keeps its Route until
// all are done) and the bytes allocated per lookup. Both must not depend on
// the cluster size.
func BenchmarkRouteConcurrent1000(b *testing.B) {
	const lookups = 1000
	for _, n := range benchSizes {
		s, closeStore := benchStore(b, n)
		w := benchWatcher(b, s)
		r := benchRouter(b, s, w)
		targets := benchTargets(n)
		ctx := context.Background()
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			var live, alloc float64
			for b.Loop() {
				before := heapInUse()
				var ms0 runtime.MemStats
				runtime.ReadMemStats(&ms0)
				var done, release sync.WaitGroup
				release.Add(1)
				routes := make([]Route, lookups)
				for i := range lookups {
					done.Add(1)
					go func() {
						rt, _ := r.Route(ctx, targets[i%len(targets)], nil)
						routes[i] = rt
						done.Done()
						release.Wait()
					}()
				}
				done.Wait()
				var ms1 runtime.MemStats
				runtime.ReadMemStats(&ms1)
				runtime.GC()
				var ms2 runtime.MemStats
				runtime.ReadMemStats(&ms2)
				release.Done()
				live = float64(ms2.HeapAlloc-before) / lookups
				alloc = float64(ms1.TotalAlloc-ms0.TotalAlloc) / lookups
				runtime.KeepAlive(routes)
			}
			b.ReportMetric(live, "live-B/lookup")
			b.ReportMetric(alloc, "alloc-B/lookup")
		})
		w.Close()
		closeStore()
	}
}

// TestRouteCostIndependentOfClusterSize is the benchmark's promise as a
// test: allocations per lookup do not grow with the cluster.
func TestRouteCostIndependentOfClusterSize(t *testing.T) {
	if testing.Short() {
		t.Skip("loads 5k nodes")
	}
	allocs := map[int]float64{}
	for _, n := range []int{100, 5000} {
		s, closeStore := benchStore(t, n)
		w := benchWatcher(t, s)
		r := benchRouter(t, s, w)
		targets := benchTargets(n)
		ctx := context.Background()
		i := 0
		allocs[n] = testing.AllocsPerRun(400, func() {
			r.Route(ctx, targets[i%len(targets)], nil)
			i++
		})
		w.Close()
		closeStore()
	}
	t.Logf("allocs per Route: %v", allocs)
	require.InDelta(t, allocs[100], allocs[5000], 1, "allocations per lookup must not depend on the cluster size")
}

// benchLeases writes leases tunnel_connections into s: the first
// leases/perNode nodes each have a tunnel on perNode proxies (a node's
// agent pool holds one to every proxy it can reach).
func benchLeases(tb testing.TB, s *services.Store, leases, perNode int) {
	tb.Helper()
	ctx := context.Background()
	for i := range leases {
		n, p := i/perNode, i%perNode
		require.NoError(tb, s.UpsertTunnelConnection(ctx, services.TunnelConnection{
			NodeUUID:  benchNode(n).UUID,
			ProxyUUID: fmt.Sprintf("%08d-0000-4000-8000-00000000beef", p),
			PeerAddr:  fmt.Sprintf("10.255.0.%d:3021", p+1),
			LastSeen:  t0,
			Expires:   t0.Add(time.Hour),
		}))
	}
}

// BenchmarkProxyIndexHeap is what each proxy holds in memory to route at
// 100k nodes: its NodeWatcher and Router, plus the TunnelLocator (the
// index of where every tunnel lives, issue 13) at 0, 10k and 30k tunnel
// leases (10k tunnel nodes on one proxy, or on each of three). The
// backend's copies are loaded before the first measurement, so only the
// proxy's own index counts. Run with -benchtime=1x.
func BenchmarkProxyIndexHeap(b *testing.B) {
	const n = 100000
	for _, tc := range []struct{ leases, perNode int }{{0, 1}, {10000, 1}, {30000, 3}} {
		s, closeStore := benchStore(b, n)
		benchLeases(b, s, tc.leases, tc.perNode)
		b.Run(fmt.Sprintf("nodes=%d/leases=%d", n, tc.leases), func(b *testing.B) {
			for b.Loop() {
				before := heapInUse()
				w := benchWatcher(b, s)
				r := benchRouter(b, s, w)
				mid := heapInUse()
				loc, err := services.NewTunnelLocator(services.TunnelLocatorConfig{Events: s, Clock: clockwork.NewFakeClockAt(t0)})
				require.NoError(b, err)
				require.NoError(b, loc.WaitSynced(context.Background()))
				after := heapInUse()
				require.Equal(b, n, w.Len())
				if tc.leases > 0 {
					require.Len(b, loc.Holders(benchNode(0).UUID, ""), tc.perNode)
				}
				b.ReportMetric(float64(mid-before)/(1<<20), "watcher+router-MB")
				b.ReportMetric(float64(after-mid)/(1<<20), "locator-MB")
				b.ReportMetric(float64(after-before)/(1<<20), "heap-MB")
				runtime.KeepAlive(r)
				loc.Close()
				w.Close()
			}
		})
		closeStore()
	}
}
