// Package memory is an in-process Backend: a sorted slice of items guarded by
// one lock, with per-item expiry driven by a clockwork clock.
//
// It exists for tests (every package above the backend runs against it with
// a fake clock) and for throwaway single-process setups. It keeps nothing on
// disk.
//
// Expiry: an expired item is invisible to reads at once; a sweeper goroutine
// removes it and emits the delete event when the clock reaches the earliest
// expiry. The sweeper waits on one clock timer, armed only while some item
// has an expiry: with a FakeClock that timer counts as one waiter for
// BlockUntil, so tests that count waiters must account for it.
package memory

import (
	"bytes"
	"container/heap"
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/backend"
)

// Config configures the memory backend.
type Config struct {
	// Clock drives expiry; nil means the real clock.
	Clock clockwork.Clock
}

// CheckAndSetDefaults fills in defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	return nil
}

// Memory is the in-memory Backend.
type Memory struct {
	clock  clockwork.Clock
	fanout *backend.Fanout

	// mu guards everything below. Writers hold it while emitting events so
	// watchers see commits in order. Lock order: mu, then the Fanout's.
	mu sync.RWMutex
	// items is sorted by Key; values are private copies.
	items []backend.Item
	// expiries is a min-heap of (expires, key, revision); entries whose item
	// was since rewritten or deleted are stale and skipped when popped.
	expiries expiryHeap
	// nextWake is when the timer is armed to fire; zero when disarmed.
	nextWake time.Time
	timer    clockwork.Timer
	rev      int64
	closed   bool

	closeCh chan struct{}
	wg      sync.WaitGroup
}

var _ backend.Backend = (*Memory)(nil)

// New returns a memory backend. Close it to stop its sweeper.
func New(cfg Config) (*Memory, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	m := &Memory{
		clock:   cfg.Clock,
		fanout:  backend.NewFanout(),
		closeCh: make(chan struct{}),
	}
	// The timer starts disarmed: an armed fake timer is a waiter that would
	// confuse BlockUntil counts in tests that store nothing with an expiry.
	m.timer = m.clock.NewTimer(time.Hour)
	m.timer.Stop()
	m.wg.Add(1)
	go m.sweepLoop()
	return m, nil
}

// Clock implements Backend.
func (m *Memory) Clock() clockwork.Clock { return m.clock }

// Close stops the sweeper and closes every watcher.
func (m *Memory) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.timer.Stop()
	close(m.closeCh)
	m.mu.Unlock()
	m.wg.Wait()
	m.fanout.Close()
	return nil
}

func (m *Memory) sweepLoop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.closeCh:
			return
		case <-m.timer.Chan():
			m.sweep()
		}
	}
}

// sweep removes every item whose expiry has passed, emits their delete
// events and re-arms the timer for the next expiry.
func (m *Memory) sweep() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	now := m.clock.Now()
	var events []backend.Event
	for len(m.expiries) > 0 && !now.Before(m.expiries[0].expires) {
		e := heap.Pop(&m.expiries).(expiry)
		i, ok := m.find(e.key)
		if !ok || m.items[i].Revision != e.revision {
			continue // rewritten or deleted since
		}
		m.items = append(m.items[:i], m.items[i+1:]...)
		events = append(events, backend.Event{Type: backend.OpDelete, Item: backend.Item{Key: e.key}})
	}
	m.nextWake = time.Time{}
	m.armLocked()
	m.fanout.Emit(events...)
}

// armLocked makes sure the timer fires no later than the earliest expiry.
func (m *Memory) armLocked() {
	if len(m.expiries) == 0 || m.closed {
		return
	}
	next := m.expiries[0].expires
	if !m.nextWake.IsZero() && !next.Before(m.nextWake) {
		return
	}
	m.nextWake = next
	m.timer.Reset(m.clock.Until(next))
}

// find returns the index of key in items, or where it would be inserted.
func (m *Memory) find(key string) (int, bool) {
	i := sort.Search(len(m.items), func(i int) bool { return m.items[i].Key >= key })
	return i, i < len(m.items) && m.items[i].Key == key
}

// liveLocked returns the index of key if it is present and not expired.
func (m *Memory) liveLocked(key string) (int, bool) {
	i, ok := m.find(key)
	if !ok || m.items[i].Expired(m.clock.Now()) {
		return i, false
	}
	return i, true
}

func copyItem(i backend.Item) backend.Item {
	if i.Value != nil {
		i.Value = bytes.Clone(i.Value)
	}
	return i
}

// Get implements Backend.
func (m *Memory) Get(ctx context.Context, key string) (*backend.Item, error) {
	if err := backend.CheckKey(key); err != nil {
		return nil, trace.Wrap(err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed()
	}
	i, ok := m.liveLocked(key)
	if !ok {
		return nil, trace.NotFound("key %q is not found", key)
	}
	it := copyItem(m.items[i])
	return &it, nil
}

// GetRange implements Backend.
func (m *Memory) GetRange(ctx context.Context, prefix string, limit int) ([]backend.Item, error) {
	if err := backend.CheckKey(prefix); err != nil {
		return nil, trace.Wrap(err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed()
	}
	now := m.clock.Now()
	start, _ := m.find(prefix)
	var out []backend.Item
	for i := start; i < len(m.items); i++ {
		it := m.items[i]
		if !strings.HasPrefix(it.Key, prefix) {
			break
		}
		if it.Expired(now) {
			continue
		}
		out = append(out, copyItem(it))
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out, nil
}

// putLocked stores item (already validated) and emits its event.
func (m *Memory) putLocked(item backend.Item) *backend.Item {
	m.rev++
	item = copyItem(item)
	item.Revision = m.rev
	i, ok := m.find(item.Key)
	if ok {
		m.items[i] = item
	} else {
		m.items = append(m.items, backend.Item{})
		copy(m.items[i+1:], m.items[i:])
		m.items[i] = item
	}
	if !item.Expires.IsZero() {
		heap.Push(&m.expiries, expiry{expires: item.Expires, key: item.Key, revision: item.Revision})
		m.armLocked()
	}
	m.fanout.Emit(backend.Event{Type: backend.OpPut, Item: copyItem(item)})
	out := copyItem(item)
	return &out
}

// Put implements Backend.
func (m *Memory) Put(ctx context.Context, item backend.Item) (*backend.Item, error) {
	if err := backend.CheckItem(item); err != nil {
		return nil, trace.Wrap(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	return m.putLocked(item), nil
}

// Create implements Backend.
func (m *Memory) Create(ctx context.Context, item backend.Item) (*backend.Item, error) {
	if err := backend.CheckItem(item); err != nil {
		return nil, trace.Wrap(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	if _, ok := m.liveLocked(item.Key); ok {
		return nil, trace.AlreadyExists("key %q already exists", item.Key)
	}
	return m.putLocked(item), nil
}

// CompareAndSwap implements Backend.
func (m *Memory) CompareAndSwap(ctx context.Context, expected, replaceWith backend.Item) (*backend.Item, error) {
	if err := backend.CheckItem(expected); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := backend.CheckItem(replaceWith); err != nil {
		return nil, trace.Wrap(err)
	}
	if expected.Key != replaceWith.Key {
		return nil, trace.BadParameter("compare and swap keys differ: %q and %q", expected.Key, replaceWith.Key)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	i, ok := m.liveLocked(expected.Key)
	if !ok {
		return nil, trace.CompareFailed("key %q is not found", expected.Key)
	}
	if !bytes.Equal(m.items[i].Value, expected.Value) {
		return nil, trace.CompareFailed("value of key %q has changed", expected.Key)
	}
	return m.putLocked(replaceWith), nil
}

// Delete implements Backend.
func (m *Memory) Delete(ctx context.Context, key string) error {
	if err := backend.CheckKey(key); err != nil {
		return trace.Wrap(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed()
	}
	i, ok := m.liveLocked(key)
	if !ok {
		return trace.NotFound("key %q is not found", key)
	}
	m.items = append(m.items[:i], m.items[i+1:]...)
	m.rev++
	m.fanout.Emit(backend.Event{Type: backend.OpDelete, Item: backend.Item{Key: key}})
	return nil
}

// DeleteRange implements Backend.
func (m *Memory) DeleteRange(ctx context.Context, prefix string) error {
	if err := backend.CheckKey(prefix); err != nil {
		return trace.Wrap(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed()
	}
	now := m.clock.Now()
	start, _ := m.find(prefix)
	end := start
	var events []backend.Event
	for ; end < len(m.items) && strings.HasPrefix(m.items[end].Key, prefix); end++ {
		// An expired item that is still here is already invisible; its
		// removal needs no event beyond the one a reader would expect.
		if !m.items[end].Expired(now) {
			events = append(events, backend.Event{Type: backend.OpDelete, Item: backend.Item{Key: m.items[end].Key}})
		}
	}
	if end == start {
		return nil
	}
	m.items = append(m.items[:start], m.items[end:]...)
	m.rev++
	m.fanout.Emit(events...)
	return nil
}

// NewWatcher implements Backend.
func (m *Memory) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	// Registering under the write lock means every commit after this call
	// returns is delivered, which is what OpInit promises.
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	w, err := m.fanout.NewWatcher(ctx, watch)
	return w, trace.Wrap(err)
}

func errClosed() error {
	return trace.ConnectionProblem(nil, "memory backend is closed")
}

type expiry struct {
	expires  time.Time
	key      string
	revision int64
}

// expiryHeap is a container/heap min-heap ordered by expires.
type expiryHeap []expiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
