// Package test is the backend conformance suite: every Backend
// implementation runs RunBackendComplianceSuite unchanged from its own tests,
// which is what lets everything above the backend be tested on the memory
// backend and trusted on SQLite and etcd.
package test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
)

// NewBackendFunc returns a fresh, empty backend for one subtest, closed by
// the function's own t.Cleanup. The FakeClock is the backend's clock, or nil
// when the backend cannot run on a fake clock (etcd leases run on the
// server's real time); the suite then uses short real TTLs and waits for the
// expiry's delete event instead.
type NewBackendFunc func(t *testing.T) (backend.Backend, *clockwork.FakeClock)

// EventTimeout bounds every wait for a watch event. It is generous because
// it only matters when a test is failing, and etcd's lease expiry on a busy
// 2-core machine can take several seconds past the requested TTL.
const EventTimeout = 30 * time.Second

// RunBackendComplianceSuite runs every conformance test against newBackend.
func RunBackendComplianceSuite(t *testing.T, newBackend NewBackendFunc) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newBackend NewBackendFunc)
	}{
		{"CRUD", testCRUD},
		{"BadKeys", testBadKeys},
		{"GetRange", testGetRange},
		{"Create", testCreate},
		{"CompareAndSwap", testCompareAndSwap},
		{"ConcurrentCompareAndSwap", testConcurrentCAS},
		{"Delete", testDelete},
		{"DeleteRange", testDeleteRange},
		{"Expiry", testExpiry},
		{"ExpiryExtended", testExpiryExtended},
		{"WatchInitFirst", testWatchInitFirst},
		{"WatchOrder", testWatchOrder},
		{"WatchPrefixes", testWatchPrefixes},
		{"WatchExpiry", testWatchExpiry},
		{"WatchQueueOverflow", testWatchOverflow},
		{"WatchClose", testWatchClose},
		{"CloseClosesWatchers", testCloseClosesWatchers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newBackend) })
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*EventTimeout)
	t.Cleanup(cancel)
	return ctx
}

func testCRUD(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)

	_, err := b.Get(ctx, "/crud/missing")
	require.True(t, trace.IsNotFound(err), "want NotFound, got %v", err)

	put, err := b.Put(ctx, backend.Item{Key: "/crud/a", Value: []byte("one")})
	require.NoError(t, err)
	require.Equal(t, "/crud/a", put.Key)
	require.NotZero(t, put.Revision)

	got, err := b.Get(ctx, "/crud/a")
	require.NoError(t, err)
	require.Equal(t, []byte("one"), got.Value)
	require.Equal(t, put.Revision, got.Revision)
	require.True(t, got.Expires.IsZero())

	put2, err := b.Put(ctx, backend.Item{Key: "/crud/a", Value: []byte("two")})
	require.NoError(t, err)
	require.NotEqual(t, put.Revision, put2.Revision)
	got, err = b.Get(ctx, "/crud/a")
	require.NoError(t, err)
	require.Equal(t, []byte("two"), got.Value)
	require.Equal(t, put2.Revision, got.Revision)

	// Values are copied in and out: mutating a returned slice must not
	// change what is stored.
	got.Value[0] = 'X'
	again, err := b.Get(ctx, "/crud/a")
	require.NoError(t, err)
	require.Equal(t, []byte("two"), again.Value)

	// An empty value is a value.
	_, err = b.Put(ctx, backend.Item{Key: "/crud/empty"})
	require.NoError(t, err)
	got, err = b.Get(ctx, "/crud/empty")
	require.NoError(t, err)
	require.Empty(t, got.Value)

	require.NoError(t, b.Delete(ctx, "/crud/a"))
	_, err = b.Get(ctx, "/crud/a")
	require.True(t, trace.IsNotFound(err), "want NotFound, got %v", err)
	require.NotNil(t, b.Clock())
}

func testBadKeys(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	for _, key := range []string{"", "nokey", "/a\x00b"} {
		_, err := b.Put(ctx, backend.Item{Key: key, Value: []byte("x")})
		require.True(t, trace.IsBadParameter(err), "Put(%q): want BadParameter, got %v", key, err)
		_, err = b.Get(ctx, key)
		require.True(t, trace.IsBadParameter(err), "Get(%q): want BadParameter, got %v", key, err)
	}
}

func testGetRange(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	// Written out of order on purpose: the result must come back sorted.
	for _, k := range []string{"/r/a/3", "/r/ab/1", "/r/a/1", "/r/b", "/r/a/2", "/r/a", "/r/a/10"} {
		_, err := b.Put(ctx, backend.Item{Key: k, Value: []byte(k)})
		require.NoError(t, err)
	}
	keys := func(items []backend.Item) []string {
		var out []string
		for _, it := range items {
			require.Equal(t, it.Key, string(it.Value))
			require.NotZero(t, it.Revision)
			out = append(out, it.Key)
		}
		return out
	}
	items, err := b.GetRange(ctx, "/r/a/", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"/r/a/1", "/r/a/10", "/r/a/2", "/r/a/3"}, keys(items))

	items, err = b.GetRange(ctx, "/r/a/", 2)
	require.NoError(t, err)
	require.Equal(t, []string{"/r/a/1", "/r/a/10"}, keys(items))

	items, err = b.GetRange(ctx, "/r/a", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"/r/a", "/r/a/1", "/r/a/10", "/r/a/2", "/r/a/3", "/r/ab/1"}, keys(items))

	items, err = b.GetRange(ctx, "/r/", 0)
	require.NoError(t, err)
	require.Len(t, items, 7)

	items, err = b.GetRange(ctx, "/nothing/", 0)
	require.NoError(t, err)
	require.Empty(t, items)
}

func testCreate(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	created, err := b.Create(ctx, backend.Item{Key: "/c/x", Value: []byte("1")})
	require.NoError(t, err)
	require.NotZero(t, created.Revision)
	_, err = b.Create(ctx, backend.Item{Key: "/c/x", Value: []byte("2")})
	require.True(t, trace.IsAlreadyExists(err), "want AlreadyExists, got %v", err)
	got, err := b.Get(ctx, "/c/x")
	require.NoError(t, err)
	require.Equal(t, []byte("1"), got.Value)

	// After a delete the key can be created again.
	require.NoError(t, b.Delete(ctx, "/c/x"))
	_, err = b.Create(ctx, backend.Item{Key: "/c/x", Value: []byte("3")})
	require.NoError(t, err)
}

func testCompareAndSwap(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)

	_, err := b.CompareAndSwap(ctx,
		backend.Item{Key: "/cas/missing", Value: []byte("a")},
		backend.Item{Key: "/cas/missing", Value: []byte("b")})
	require.True(t, trace.IsCompareFailed(err) || trace.IsNotFound(err), "want CompareFailed or NotFound, got %v", err)
	_, err = b.Get(ctx, "/cas/missing")
	require.True(t, trace.IsNotFound(err), "a failed swap must not create the key: %v", err)

	_, err = b.Put(ctx, backend.Item{Key: "/cas/k", Value: []byte("a")})
	require.NoError(t, err)

	_, err = b.CompareAndSwap(ctx,
		backend.Item{Key: "/cas/k", Value: []byte("wrong")},
		backend.Item{Key: "/cas/k", Value: []byte("b")})
	require.True(t, trace.IsCompareFailed(err), "want CompareFailed, got %v", err)
	got, err := b.Get(ctx, "/cas/k")
	require.NoError(t, err)
	require.Equal(t, []byte("a"), got.Value)

	swapped, err := b.CompareAndSwap(ctx,
		backend.Item{Key: "/cas/k", Value: []byte("a")},
		backend.Item{Key: "/cas/k", Value: []byte("b")})
	require.NoError(t, err)
	require.Equal(t, []byte("b"), swapped.Value)
	require.NotZero(t, swapped.Revision)
	got, err = b.Get(ctx, "/cas/k")
	require.NoError(t, err)
	require.Equal(t, []byte("b"), got.Value)
	require.Equal(t, swapped.Revision, got.Revision)

	_, err = b.CompareAndSwap(ctx,
		backend.Item{Key: "/cas/k", Value: []byte("b")},
		backend.Item{Key: "/cas/other", Value: []byte("c")})
	require.True(t, trace.IsBadParameter(err), "different keys: want BadParameter, got %v", err)
}

// testConcurrentCAS increments one counter from many goroutines with
// read-modify-CAS loops: if CompareAndSwap were not atomic, two of them would
// both "win" from the same value and an increment would be lost.
func testConcurrentCAS(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	const workers, perWorker = 8, 5
	const key = "/counter"
	_, err := b.Put(ctx, backend.Item{Key: key, Value: []byte("0")})
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				for {
					cur, err := b.Get(ctx, key)
					if err != nil {
						errs <- err
						return
					}
					n, err := strconv.Atoi(string(cur.Value))
					if err != nil {
						errs <- err
						return
					}
					_, err = b.CompareAndSwap(ctx, *cur, backend.Item{Key: key, Value: []byte(strconv.Itoa(n + 1))})
					if err == nil {
						break
					}
					if !trace.IsCompareFailed(err) {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got, err := b.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(workers*perWorker), string(got.Value))
}

func testDelete(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	err := b.Delete(ctx, "/d/missing")
	require.True(t, trace.IsNotFound(err), "want NotFound, got %v", err)
	_, err = b.Put(ctx, backend.Item{Key: "/d/x", Value: []byte("1")})
	require.NoError(t, err)
	require.NoError(t, b.Delete(ctx, "/d/x"))
	err = b.Delete(ctx, "/d/x")
	require.True(t, trace.IsNotFound(err), "second delete: want NotFound, got %v", err)
}

func testDeleteRange(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	for _, k := range []string{"/dr/a/1", "/dr/a/2", "/dr/a/x/3", "/dr/ab", "/dr/b/1"} {
		_, err := b.Put(ctx, backend.Item{Key: k, Value: []byte("v")})
		require.NoError(t, err)
	}
	require.NoError(t, b.DeleteRange(ctx, "/dr/a/"))
	items, err := b.GetRange(ctx, "/dr/", 0)
	require.NoError(t, err)
	var keys []string
	for _, it := range items {
		keys = append(keys, it.Key)
	}
	require.Equal(t, []string{"/dr/ab", "/dr/b/1"}, keys)
	// Deleting an empty range is not an error.
	require.NoError(t, b.DeleteRange(ctx, "/dr/none/"))
}

// expireTTL is the TTL used on real clocks: above etcd's minimum lease TTL
// (it would silently round a shorter one up anyway) yet short enough to keep
// the suite quick.
const expireTTL = 2 * time.Second

// testExpiry checks that an expired item disappears from reads. With a fake
// clock it checks the instant; with a real one it waits for the delete event
// and then checks reads.
func testExpiry(t *testing.T, newBackend NewBackendFunc) {
	b, clock := newBackend(t)
	ctx := ctxFor(t)
	ttl := expireTTL
	if clock != nil {
		ttl = time.Minute
	}
	expires := b.Clock().Now().Add(ttl).Truncate(time.Second).Add(time.Second)
	_, err := b.Put(ctx, backend.Item{Key: "/e/short", Value: []byte("v"), Expires: expires})
	require.NoError(t, err)
	_, err = b.Put(ctx, backend.Item{Key: "/e/long", Value: []byte("v"), Expires: expires.Add(time.Hour)})
	require.NoError(t, err)
	_, err = b.Put(ctx, backend.Item{Key: "/e/forever", Value: []byte("v")})
	require.NoError(t, err)

	got, err := b.Get(ctx, "/e/short")
	require.NoError(t, err)
	// Backends may store expiry with second precision (etcd leases); the
	// suite only asks for whole seconds, so it must come back exact.
	require.True(t, expires.Equal(got.Expires), "expires %v, got %v", expires, got.Expires)

	w, err := b.NewWatcher(ctx, backend.Watch{Name: "expiry", Prefixes: []string{"/e/"}})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	expectEvent(t, w, backend.OpInit, "")

	if clock != nil {
		clock.Advance(expires.Sub(clock.Now()))
		// Reads must not wait for the sweeper.
		_, err = b.Get(ctx, "/e/short")
		require.True(t, trace.IsNotFound(err), "want NotFound right at expiry, got %v", err)
	}
	expectEvent(t, w, backend.OpDelete, "/e/short")

	_, err = b.Get(ctx, "/e/short")
	require.True(t, trace.IsNotFound(err), "want NotFound after expiry, got %v", err)
	items, err := b.GetRange(ctx, "/e/", 0)
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.Equal(t, "/e/forever", items[0].Key)
	require.Equal(t, "/e/long", items[1].Key)

	// An expired key no longer exists: Create may reuse it.
	_, err = b.Create(ctx, backend.Item{Key: "/e/short", Value: []byte("again")})
	require.NoError(t, err)
}

// testExpiryExtended is the heartbeat pattern: rewriting an item with a
// later expiry (or none) must cancel the earlier one. A marker key with the
// original expiry shows when that moment has passed.
func testExpiryExtended(t *testing.T, newBackend NewBackendFunc) {
	b, clock := newBackend(t)
	ctx := ctxFor(t)
	ttl := expireTTL
	if clock != nil {
		ttl = 10 * time.Second
	}
	first := b.Clock().Now().Add(ttl)
	for _, k := range []string{"/x/extended", "/x/cleared", "/x/marker"} {
		_, err := b.Put(ctx, backend.Item{Key: k, Value: []byte("v1"), Expires: first})
		require.NoError(t, err)
	}
	_, err := b.Put(ctx, backend.Item{Key: "/x/extended", Value: []byte("v2"), Expires: first.Add(time.Hour)})
	require.NoError(t, err)
	_, err = b.Put(ctx, backend.Item{Key: "/x/cleared", Value: []byte("v2")})
	require.NoError(t, err)

	w, err := b.NewWatcher(ctx, backend.Watch{Name: "extended", Prefixes: []string{"/x/"}})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	expectEvent(t, w, backend.OpInit, "")
	if clock != nil {
		clock.Advance(ttl)
	}
	// The marker's delete must be the only event.
	expectEvent(t, w, backend.OpDelete, "/x/marker")
	items, err := b.GetRange(ctx, "/x/", 0)
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.Equal(t, "/x/cleared", items[0].Key)
	require.True(t, items[0].Expires.IsZero())
	require.Equal(t, "/x/extended", items[1].Key)
	require.Equal(t, []byte("v2"), items[1].Value)
	_, err = b.Put(ctx, backend.Item{Key: "/x/end", Value: []byte("v")})
	require.NoError(t, err)
	expectEvent(t, w, backend.OpPut, "/x/end")
}

func testWatchInitFirst(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	_, err := b.Put(ctx, backend.Item{Key: "/wi/before", Value: []byte("v")})
	require.NoError(t, err)
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "init"})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	expectEvent(t, w, backend.OpInit, "")
	// Writes before the watch started are not replayed; the next event is
	// the first write after OpInit.
	_, err = b.Put(ctx, backend.Item{Key: "/wi/after", Value: []byte("v2")})
	require.NoError(t, err)
	ev := expectEvent(t, w, backend.OpPut, "/wi/after")
	require.Equal(t, []byte("v2"), ev.Item.Value)
	require.NotZero(t, ev.Item.Revision)
}

// testWatchOrder interleaves puts, updates and deletes over a few keys and
// checks the watcher sees exactly that sequence.
func testWatchOrder(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "order", Prefixes: []string{"/wo/"}})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	expectEvent(t, w, backend.OpInit, "")

	type op struct {
		typ   backend.OpType
		key   string
		value string
	}
	var want []op
	present := map[string]bool{}
	const n = 300
	for i := range n {
		key := fmt.Sprintf("/wo/k%d", i%7)
		if present[key] && i%3 == 0 {
			require.NoError(t, b.Delete(ctx, key))
			present[key] = false
			want = append(want, op{backend.OpDelete, key, ""})
			continue
		}
		value := strconv.Itoa(i)
		_, err := b.Put(ctx, backend.Item{Key: key, Value: []byte(value)})
		require.NoError(t, err)
		present[key] = true
		want = append(want, op{backend.OpPut, key, value})
	}
	for i, o := range want {
		ev := expectEvent(t, w, o.typ, o.key)
		if o.typ == backend.OpPut {
			require.Equal(t, o.value, string(ev.Item.Value), "event %d", i)
		}
	}
}

func testWatchPrefixes(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "prefixes", Prefixes: []string{"/wp/a/", "/wp/c/"}})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	expectEvent(t, w, backend.OpInit, "")
	for _, k := range []string{"/wp/ab", "/wp/a/1", "/wp/b/1", "/wp/c/1", "/other", "/wp/a/2"} {
		_, err := b.Put(ctx, backend.Item{Key: k, Value: []byte("v")})
		require.NoError(t, err)
	}
	require.NoError(t, b.Delete(ctx, "/wp/b/1"))
	require.NoError(t, b.Delete(ctx, "/wp/c/1"))
	expectEvent(t, w, backend.OpPut, "/wp/a/1")
	expectEvent(t, w, backend.OpPut, "/wp/c/1")
	expectEvent(t, w, backend.OpPut, "/wp/a/2")
	expectEvent(t, w, backend.OpDelete, "/wp/c/1")
	// A final marker proves nothing else was queued in between.
	_, err = b.Put(ctx, backend.Item{Key: "/wp/a/end", Value: []byte("v")})
	require.NoError(t, err)
	expectEvent(t, w, backend.OpPut, "/wp/a/end")
}

func testWatchExpiry(t *testing.T, newBackend NewBackendFunc) {
	b, clock := newBackend(t)
	ctx := ctxFor(t)
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "watch-expiry", Prefixes: []string{"/we/"}})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	expectEvent(t, w, backend.OpInit, "")
	ttl := expireTTL
	if clock != nil {
		ttl = 10 * time.Second
	}
	expires := b.Clock().Now().Add(ttl)
	_, err = b.Put(ctx, backend.Item{Key: "/we/node", Value: []byte("v"), Expires: expires})
	require.NoError(t, err)
	ev := expectEvent(t, w, backend.OpPut, "/we/node")
	require.False(t, ev.Item.Expires.IsZero(), "put event must carry the expiry")
	if clock != nil {
		// Just before expiry nothing happens.
		clock.Advance(ttl - time.Millisecond)
		_, err = b.Get(ctx, "/we/node")
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
	}
	expectEvent(t, w, backend.OpDelete, "/we/node")
}

func testWatchOverflow(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	const queue = 4
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "overflow", QueueSize: queue})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	// Nobody reads: the queue fills and the watcher must be closed with an
	// error rather than block the writer or drop events silently.
	for i := range 4 * queue {
		_, err := b.Put(ctx, backend.Item{Key: fmt.Sprintf("/wf/%d", i), Value: []byte("v")})
		require.NoError(t, err)
	}
	select {
	case <-w.Done():
	case <-time.After(EventTimeout):
		t.Fatal("watcher with a full queue was not closed")
	}
	require.Error(t, w.Error())
	require.True(t, trace.IsLimitExceeded(w.Error()), "want LimitExceeded, got %v", w.Error())
	// Writes keep working.
	_, err = b.Put(ctx, backend.Item{Key: "/wf/after", Value: []byte("v")})
	require.NoError(t, err)
}

func testWatchClose(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "close"})
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.NoError(t, w.Close())
	waitDone(t, w)
	require.NoError(t, w.Error(), "a watcher closed by its owner has no error")

	cctx, cancel := context.WithCancel(ctx)
	w2, err := b.NewWatcher(cctx, backend.Watch{Name: "ctx"})
	require.NoError(t, err)
	cancel()
	waitDone(t, w2)
	require.Error(t, w2.Error())
}

func testCloseClosesWatchers(t *testing.T, newBackend NewBackendFunc) {
	b, _ := newBackend(t)
	ctx := ctxFor(t)
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "backend-close"})
	require.NoError(t, err)
	expectEvent(t, w, backend.OpInit, "")
	require.NoError(t, b.Close())
	waitDone(t, w)
	require.Error(t, w.Error())
	// Close is idempotent (the constructor's cleanup closes again).
	require.NoError(t, b.Close())
}

func waitDone(t *testing.T, w backend.Watcher) {
	t.Helper()
	select {
	case <-w.Done():
	case <-time.After(EventTimeout):
		t.Fatal("watcher did not close")
	}
}

// expectEvent waits for the next event and checks its type and key.
func expectEvent(t *testing.T, w backend.Watcher, typ backend.OpType, key string) backend.Event {
	t.Helper()
	select {
	case ev := <-w.Events():
		require.Equal(t, typ.String(), ev.Type.String(), "event %+v", ev)
		require.Equal(t, key, ev.Item.Key, "event %+v", ev)
		return ev
	case <-w.Done():
		t.Fatalf("watcher closed while waiting for %v %q: %v", typ, key, w.Error())
	case <-time.After(EventTimeout):
		t.Fatalf("timed out waiting for %v %q", typ, key)
	}
	return backend.Event{}
}
