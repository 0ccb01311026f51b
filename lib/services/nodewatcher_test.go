package services

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
)

// testEvents wraps a Store's NodeEvents so tests can run code around the
// initial load and break the live watch from under the watcher.
type testEvents struct {
	NodeEvents
	// beforeLoad and afterLoad, when set, run around every GetNodes.
	beforeLoad, afterLoad func()

	mu       sync.Mutex
	watchers []*breakableWatcher
	loads    int
}

func (e *testEvents) NewWatcher(ctx context.Context, w backend.Watch) (backend.Watcher, error) {
	inner, err := e.NodeEvents.NewWatcher(ctx, w)
	if err != nil {
		return nil, err
	}
	bw := &breakableWatcher{Watcher: inner, done: make(chan struct{})}
	e.mu.Lock()
	e.watchers = append(e.watchers, bw)
	e.mu.Unlock()
	return bw, nil
}

func (e *testEvents) GetNodes(ctx context.Context, cluster string) ([]Node, error) {
	if e.beforeLoad != nil {
		e.beforeLoad()
	}
	nodes, err := e.NodeEvents.GetNodes(ctx, cluster)
	if e.afterLoad != nil {
		e.afterLoad()
	}
	e.mu.Lock()
	e.loads++
	e.mu.Unlock()
	return nodes, err
}

// breakLatest breaks the most recent watcher, as a backend whose watch
// dies (network, overflow) would.
func (e *testEvents) breakLatest() {
	e.mu.Lock()
	w := e.watchers[len(e.watchers)-1]
	e.mu.Unlock()
	w.breakWith(errors.New("connection to backend lost"))
}

type breakableWatcher struct {
	backend.Watcher
	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	err  error
}

func (w *breakableWatcher) Done() <-chan struct{} { return w.done }

func (w *breakableWatcher) Error() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *breakableWatcher) breakWith(err error) {
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
	w.Close()
}

func (w *breakableWatcher) Close() error {
	w.once.Do(func() { close(w.done) })
	return w.Watcher.Close()
}

func testNode(cluster, uuid, hostname, addr string) Node {
	return Node{UUID: uuid, Hostname: hostname, Addr: addr, Cluster: cluster}
}

func newTestNodeWatcher(t *testing.T, events NodeEvents, clock clockwork.Clock) *NodeWatcher {
	t.Helper()
	w, err := NewNodeWatcher(NodeWatcherConfig{Events: events, Clock: clock, MinBackoff: time.Second, MaxBackoff: 8 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	return w
}

func uuids(nodes []Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.UUID)
	}
	return out
}

// eventuallyFind waits until Find returns exactly the UUIDs want.
func eventuallyFind(t *testing.T, w *NodeWatcher, q NodeQuery, want ...string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assertCollect) {
		got, err := w.Find(context.Background(), q)
		if !assertNoError(c, err) {
			return
		}
		assertElementsMatch(c, want, uuids(got))
	}, 10*time.Second, time.Millisecond)
}

func TestNodeWatcherFind(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewRealClock())
	for _, n := range []Node{
		testNode("c1", "u1", "web", "10.0.0.1:3022"),
		testNode("c1", "u2", "Web", "10.0.0.2:3022"),
		testNode("c1", "u3", "db", "[2001:db8::1]:22"),
		testNode("c1", "u4", "10.0.0.1", "10.0.0.9:3022"),    // hostname equals another node's addr host
		testNode("c1", "web", "api", "api.example.com:3022"), // uuid equals another node's hostname
		testNode("c2", "u5", "web", "10.0.0.1:3022"),
	} {
		require.NoError(t, s.UpsertNode(ctx, n))
	}
	w := newTestNodeWatcher(t, s.NodeEvents(), clockwork.NewFakeClock())
	for _, tc := range []struct {
		q    NodeQuery
		want []string
	}{
		{NodeQuery{Cluster: "c1", Host: "web"}, []string{"u1", "web"}},
		{NodeQuery{Cluster: "c1", Host: "WEB", CaseInsensitive: true}, []string{"u1", "u2"}},
		{NodeQuery{Cluster: "c1", Host: "WEB"}, nil},
		{NodeQuery{Cluster: "c1", Host: "10.0.0.1"}, []string{"u1", "u4"}},
		{NodeQuery{Cluster: "c1", Host: "2001:db8::1"}, []string{"u3"}},
		{NodeQuery{Cluster: "c1", Host: "2001:DB8:0::1"}, []string{"u3"}},
		{NodeQuery{Cluster: "c1", Host: "API.example.com"}, []string{"web"}},
		{NodeQuery{Cluster: "c1", Host: "u3"}, []string{"u3"}},
		{NodeQuery{Cluster: "c2", Host: "web"}, []string{"u5"}},
		{NodeQuery{Cluster: "c3", Host: "web"}, nil},
		{NodeQuery{Cluster: "c1", Host: ""}, nil},
	} {
		got, err := w.Find(ctx, tc.q)
		require.NoError(t, err)
		require.ElementsMatch(t, tc.want, uuids(got), "%+v", tc.q)
	}
	require.Equal(t, 6, w.Len())
	require.NoError(t, w.Healthy())
	_, err := w.Find(ctx, NodeQuery{Host: "web"})
	require.True(t, trace.IsBadParameter(err))

	// Results are copies: changing one does not change the watcher.
	got, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: "u1"})
	require.NoError(t, err)
	got[0].Hostname = "changed"
	got, err = w.Find(ctx, NodeQuery{Cluster: "c1", Host: "u1"})
	require.NoError(t, err)
	require.Equal(t, "web", got[0].Hostname)

	all, err := w.GetNodes(ctx, "c1")
	require.NoError(t, err)
	require.Len(t, all, 5)
}

func TestNodeWatcherEventsInOrder(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewRealClock())
	w := newTestNodeWatcher(t, s.NodeEvents(), clockwork.NewFakeClock())
	require.NoError(t, w.WaitSynced(ctx))
	require.Equal(t, 0, w.Len())

	// A node renamed three times, deleted, re-added: only the last write
	// may be visible, under its last name only.
	for _, h := range []string{"a", "b", "c"} {
		require.NoError(t, s.UpsertNode(ctx, testNode("c1", "u1", h, "10.0.0.1:3022")))
	}
	require.NoError(t, s.DeleteNode(ctx, "c1", "u1"))
	require.NoError(t, s.UpsertNode(ctx, testNode("c1", "u1", "d", "10.0.0.2:3022")))
	for i := range 50 {
		require.NoError(t, s.UpsertNode(ctx, testNode("c1", fmt.Sprintf("n%02d", i), "bulk", "10.1.0.1:22")))
	}
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "bulk"}, func() []string {
		var out []string
		for i := range 50 {
			out = append(out, fmt.Sprintf("n%02d", i))
		}
		return out
	}()...)
	// Events are applied in order, so once the last write is visible every
	// earlier one has been applied.
	for _, h := range []string{"a", "b", "c", "10.0.0.1"} {
		got, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: h})
		require.NoError(t, err)
		require.Empty(t, got, h)
	}
	got, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: "d"})
	require.NoError(t, err)
	require.Equal(t, []string{"u1"}, uuids(got))
	require.Equal(t, "10.0.0.2:3022", got[0].Addr)
	require.Equal(t, 51, w.Len())
}

func TestNodeWatcherNoEventLostDuringLoad(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewRealClock())
	require.NoError(t, s.UpsertNode(ctx, testNode("c1", "before", "before", "10.0.0.1:22")))
	require.NoError(t, s.UpsertNode(ctx, testNode("c1", "doomed", "doomed", "10.0.0.2:22")))
	events := &testEvents{NodeEvents: s.NodeEvents()}
	// Writes that race with the initial load: one the load sees (written
	// before it reads) and several it cannot see (written after it read),
	// including a delete of a node the load returned.
	events.beforeLoad = func() {
		require.NoError(t, s.UpsertNode(ctx, testNode("c1", "during", "during", "10.0.0.3:22")))
	}
	events.afterLoad = func() {
		require.NoError(t, s.UpsertNode(ctx, testNode("c1", "after", "after", "10.0.0.4:22")))
		require.NoError(t, s.UpsertNode(ctx, testNode("c1", "before", "renamed", "10.0.0.1:22")))
		require.NoError(t, s.DeleteNode(ctx, "c1", "doomed"))
	}
	w := newTestNodeWatcher(t, events, clockwork.NewFakeClock())
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "after"}, "after")
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "renamed"}, "before")
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "doomed"})
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "during"}, "during")
	// "before" still matches by UUID, now under its new hostname.
	got, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: "before"})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "renamed", got[0].Hostname)
	require.Equal(t, 3, w.Len())
}

func TestNodeWatcherExpiry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The backend runs on its own clock that never moves, so it never
	// sweeps and no delete event comes: the watcher alone must drop the
	// node at its Expires.
	s := newTestStore(t, clockwork.NewFakeClock())
	clock := clockwork.NewFakeClockAt(s.Backend().Clock().Now())
	n := testNode("c1", "u1", "web", "10.0.0.1:22")
	n.Expires = clock.Now().Add(time.Minute)
	require.NoError(t, s.UpsertNode(ctx, n))
	require.NoError(t, s.UpsertNode(ctx, testNode("c1", "u2", "web", "10.0.0.2:22")))

	w := newTestNodeWatcher(t, s.NodeEvents(), clock)
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "web"}, "u1", "u2")

	// The prune ticker is the watcher clock's only waiter.
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(time.Minute - time.Nanosecond)
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "web"}, "u1", "u2")
	clock.Advance(time.Nanosecond)
	got, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: "web"})
	require.NoError(t, err)
	require.Equal(t, []string{"u2"}, uuids(got), "expired at its Expires, filtered at read time")
	all, err := w.GetNodes(ctx, "")
	require.NoError(t, err)
	require.Len(t, all, 1)

	// The prune (60s of fake time = 4 ticks) frees the record.
	require.Eventually(t, func() bool { return w.Len() == 1 }, 10*time.Second, time.Millisecond)
}

func TestNodeWatcherResyncAfterBrokenWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := newTestStore(t, clockwork.NewRealClock())
	require.NoError(t, s.UpsertNode(ctx, testNode("c1", "u1", "web", "10.0.0.1:22")))
	events := &testEvents{NodeEvents: s.NodeEvents()}
	clock := clockwork.NewFakeClock()
	w := newTestNodeWatcher(t, events, clock)
	require.NoError(t, w.WaitSynced(ctx))
	require.NoError(t, w.Healthy())

	for round := 1; round <= 2; round++ {
		events.breakLatest()
		require.Eventually(t, func() bool { return w.Healthy() != nil }, 10*time.Second, time.Millisecond)
		require.Equal(t, uint64(round), w.Failures())
		require.ErrorContains(t, w.Healthy(), "connection to backend lost")
		require.True(t, trace.IsConnectionProblem(w.Healthy()))

		// While broken, the last good view still answers, and writes go
		// unseen until the re-sync.
		host := fmt.Sprintf("new%d", round)
		require.NoError(t, s.UpsertNode(ctx, testNode("c1", host, host, "10.0.0.2:22")))
		got, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: "web"})
		require.NoError(t, err)
		require.Equal(t, []string{"u1"}, uuids(got))

		// Prune ticker + backoff timer. The backoff after a watch that
		// had synced restarts at MinBackoff.
		require.NoError(t, clock.BlockUntilContext(ctx, 2))
		clock.Advance(time.Second)
		require.Eventually(t, func() bool { return w.Healthy() == nil }, 10*time.Second, time.Millisecond)
		eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: host}, host)
	}
	events.mu.Lock()
	require.Equal(t, 3, events.loads)
	events.mu.Unlock()
}

// failingEvents fails to start a watch a given number of times.
type failingEvents struct {
	NodeEvents
	mu    sync.Mutex
	fails int
}

func (e *failingEvents) NewWatcher(ctx context.Context, w backend.Watch) (backend.Watcher, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fails > 0 {
		e.fails--
		return nil, trace.ConnectionProblem(nil, "backend unreachable")
	}
	return e.NodeEvents.NewWatcher(ctx, w)
}

func TestNodeWatcherBackoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := newTestStore(t, clockwork.NewRealClock())
	require.NoError(t, s.UpsertNode(ctx, testNode("c1", "u1", "web", "10.0.0.1:22")))
	clock := clockwork.NewFakeClock()
	w := newTestNodeWatcher(t, &failingEvents{NodeEvents: s.NodeEvents(), fails: 3}, clock)

	// Before the first sync, Find waits, bounded by its context.
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err := w.Find(short, NodeQuery{Cluster: "c1", Host: "web"})
	cancelShort()
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.ErrorContains(t, w.Healthy(), "backend unreachable")

	// Backoff doubles: 1s, 2s, 4s, each wait drawn from [d/2, d] (jitter).
	// Advancing less than the shortest wait does not retry; the longest
	// always does.
	for i, d := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		require.NoError(t, clock.BlockUntilContext(ctx, 2))
		require.Equal(t, uint64(i+1), w.Failures())
		clock.Advance(d/2 - time.Millisecond)
		require.Equal(t, uint64(i+1), w.Failures())
		clock.Advance(d/2 + time.Millisecond)
		if i < 2 {
			require.Eventually(t, func() bool { return w.Failures() == uint64(i+2) }, 10*time.Second, time.Millisecond)
		}
	}
	got, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: "web"})
	require.NoError(t, err)
	require.Equal(t, []string{"u1"}, uuids(got))
	require.NoError(t, w.Healthy())
}

func TestNodeWatcherClose(t *testing.T) {
	s := newTestStore(t, clockwork.NewRealClock())
	w, err := NewNodeWatcher(NodeWatcherConfig{Events: s.NodeEvents()})
	require.NoError(t, err)
	require.NoError(t, w.WaitSynced(context.Background()))
	require.NoError(t, w.Close())
	require.NoError(t, w.Close())
	<-w.Done()
	_, err = NewNodeWatcher(NodeWatcherConfig{})
	require.True(t, trace.IsBadParameter(err))
}

func TestNodeWatcherConcurrentReaders(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewRealClock())
	w := newTestNodeWatcher(t, s.NodeEvents(), clockwork.NewRealClock())
	require.NoError(t, w.WaitSynced(ctx))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				nodes, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: "web", CaseInsensitive: true})
				if err != nil {
					t.Error(err)
					return
				}
				for _, n := range nodes {
					_ = n.Labels["env"]
				}
			}
		})
	}
	for i := range 200 {
		n := testNode("c1", fmt.Sprintf("u%d", i%10), "web", fmt.Sprintf("10.0.0.%d:22", i%10+1))
		n.Labels = map[string]string{"env": "prod"}
		require.NoError(t, s.UpsertNode(ctx, n))
		if i%7 == 0 {
			require.NoError(t, s.DeleteNode(ctx, "c1", n.UUID))
		}
	}
	close(stop)
	wg.Wait()
}

func TestNodeWatcherSkipsBadRecords(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewRealClock())
	// A corrupt record present at the initial load does not stop the sync.
	_, err := s.Backend().Put(ctx, backend.Item{Key: NodeKey("c1", "u0"), Value: []byte("garbage")})
	require.NoError(t, err)
	w := newTestNodeWatcher(t, s.NodeEvents(), clockwork.NewFakeClock())
	require.NoError(t, w.WaitSynced(ctx))
	require.NoError(t, s.UpsertNode(ctx, testNode("c1", "u1", "web", "10.0.0.1:22")))
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "web"}, "u1")
	// Garbage at a node key, and a body that names another node than its
	// key: both are dropped (the first also removes what was there), and
	// the watch goes on.
	_, err = s.Backend().Put(ctx, backend.Item{Key: NodeKey("c1", "u1"), Value: []byte("{not json")})
	require.NoError(t, err)
	_, err = s.Backend().Put(ctx, backend.Item{Key: NodeKey("c1", "u2"), Value: []byte(`{"uuid":"u3","cluster":"c1","hostname":"x","addr":"h:1"}`)})
	require.NoError(t, err)
	require.NoError(t, s.UpsertNode(ctx, testNode("c1", "u4", "api", "10.0.0.4:22")))
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "api"}, "u4")
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "web"})
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "x"})
	require.NoError(t, w.Healthy())
	require.Equal(t, 1, w.Len())
}

// TestNodeWatcherOpenSSHNodes: OpenSSH records have no Expires and never
// expire; OpenSSHNodes lists exactly them, per cluster, and follows a
// record that changes kind or goes away.
func TestNodeWatcherOpenSSHNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := newTestStore(t, clockwork.NewFakeClock())
	clock := clockwork.NewFakeClockAt(s.Backend().Clock().Now())
	o1 := testNode("c1", "o1", "db", "10.0.0.1:22")
	o1.Kind, o1.Expires = NodeKindOpenSSH, time.Time{}
	o2 := testNode("c2", "o2", "db", "10.0.0.2:22")
	o2.Kind, o2.Expires = NodeKindOpenSSH, time.Time{}
	p := testNode("c1", "p1", "web", "10.0.0.3:22")
	p.Expires = clock.Now().Add(time.Minute)
	for _, n := range []Node{o1, o2, p} {
		require.NoError(t, s.UpsertNode(ctx, n))
	}
	w := newTestNodeWatcher(t, s.NodeEvents(), clock)
	got, err := w.OpenSSHNodes(ctx, "c1")
	require.NoError(t, err)
	require.Equal(t, []Node{o1}, got)
	got, err = w.OpenSSHNodes(ctx, "nope")
	require.NoError(t, err)
	require.Empty(t, got)

	// A day later the Postern node is long gone, the OpenSSH one routes.
	clock.Advance(24 * time.Hour)
	eventuallyFind(t, w, NodeQuery{Cluster: "c1", Host: "db"}, "o1")
	found, err := w.Find(ctx, NodeQuery{Cluster: "c1", Host: "web"})
	require.NoError(t, err)
	require.Empty(t, found)

	// Rewritten as a Postern node: no longer listed; removed: gone.
	o1.Kind = NodeKindPostern
	require.NoError(t, s.UpsertNode(ctx, o1))
	require.Eventually(t, func() bool {
		got, err := w.OpenSSHNodes(ctx, "c1")
		return err == nil && len(got) == 0
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, s.DeleteNode(ctx, "c2", "o2"))
	require.Eventually(t, func() bool {
		got, err := w.OpenSSHNodes(ctx, "c2")
		return err == nil && len(got) == 0
	}, 10*time.Second, time.Millisecond)
}
