package backend

import (
	"context"
	"sync"

	"github.com/gravitational/trace"
)

// BufferedWatcher is the Watcher every implementation hands out: a bounded
// queue fed by the backend (Push) and drained by the reader (Events).
//
// The queue never blocks the producer. Backends push while holding their
// write lock (that is how commit order is preserved), so a reader that stops
// reading must not be able to stall writers; instead the watcher is closed
// with a LimitExceeded error and the reader re-syncs from a fresh watch.
//
// The Events channel is never closed: a zero Event is an OpInit, and a reader
// that mistook a closed channel for one would think a dead watch were live.
// Readers select on Done.
type BufferedWatcher struct {
	watch  Watch
	events chan Event
	done   chan struct{}

	// mu guards closed, err and stopCtx, and is held across the non-blocking send in
	// Push so a push can never race with Close (no send after Done).
	mu     sync.Mutex
	closed bool
	err    error

	// stopCtx detaches the context.AfterFunc that closes the watcher when
	// the caller's context ends.
	stopCtx func() bool
	// onClose, when set, runs once after the watcher is closed (the owner
	// uses it to unregister the watcher).
	onClose func(*BufferedWatcher)
}

// NewBufferedWatcher returns an open watcher with OpInit already queued. It
// closes itself when ctx is done. onClose (optional) runs once, without any
// watcher lock held, after the watcher is closed for whatever reason.
func NewBufferedWatcher(ctx context.Context, watch Watch, onClose func(*BufferedWatcher)) *BufferedWatcher {
	if watch.QueueSize <= 0 {
		watch.QueueSize = DefaultWatchQueueSize
	}
	w := &BufferedWatcher{
		watch:   watch,
		events:  make(chan Event, watch.QueueSize),
		done:    make(chan struct{}),
		onClose: onClose,
	}
	w.events <- Event{Type: OpInit}
	stop := context.AfterFunc(ctx, func() {
		w.closeWithError(trace.Wrap(context.Cause(ctx), "watcher %q: context done", watch.Name))
	})
	// The func above may already be running (ctx was done), hence the lock.
	w.mu.Lock()
	w.stopCtx = stop
	w.mu.Unlock()
	return w
}

// NewBufferedWatcherNoInit is NewBufferedWatcher without the OpInit event,
// for backends (etcd) that must wait until their native watch is established
// before they can promise that nothing will be missed; they Push OpInit
// themselves at that moment.
func NewBufferedWatcherNoInit(ctx context.Context, watch Watch, onClose func(*BufferedWatcher)) *BufferedWatcher {
	w := NewBufferedWatcher(ctx, watch, onClose)
	<-w.events
	return w
}

// Watch returns the parameters the watcher was created with (QueueSize
// defaulted).
func (w *BufferedWatcher) Watch() Watch { return w.watch }

// Matches reports whether key is one this watcher wants.
func (w *BufferedWatcher) Matches(key string) bool {
	return MatchesAny(key, w.watch.Prefixes)
}

// Push queues ev without blocking. When the queue is full the watcher is
// closed with a LimitExceeded error. It returns false if the watcher is (now)
// closed. Push does not filter by prefix: call Matches first.
func (w *BufferedWatcher) Push(ev Event) bool {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	select {
	case w.events <- ev:
		w.mu.Unlock()
		return true
	default:
	}
	w.mu.Unlock()
	w.CloseWithError(trace.LimitExceeded(
		"watcher %q fell behind: its queue of %d events is full; the reader must re-sync",
		w.watch.Name, cap(w.events)))
	return false
}

// Events implements Watcher.
func (w *BufferedWatcher) Events() <-chan Event { return w.events }

// Done implements Watcher.
func (w *BufferedWatcher) Done() <-chan struct{} { return w.done }

// Error implements Watcher: nil while open and after Close by the owner.
func (w *BufferedWatcher) Error() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close implements Watcher.
func (w *BufferedWatcher) Close() error {
	w.closeWithError(nil)
	return nil
}

// CloseWithError closes the watcher on behalf of the backend, recording why.
func (w *BufferedWatcher) CloseWithError(err error) {
	if err == nil {
		err = trace.ConnectionProblem(nil, "watcher %q closed by the backend", w.watch.Name)
	}
	w.closeWithError(err)
}

func (w *BufferedWatcher) closeWithError(err error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	w.err = err
	close(w.done)
	stop := w.stopCtx
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
	if w.onClose != nil {
		w.onClose(w)
	}
}

var _ Watcher = (*BufferedWatcher)(nil)

// Fanout delivers committed events to in-process watchers. The memory and
// SQLite backends use it: both are only ever opened by one process, so
// fanning out in-process right after each commit is enough, and cheaper and
// simpler than an event log table.
//
// Ordering: the backend must call Emit while still holding its write lock,
// so events reach every watcher in commit order.
type Fanout struct {
	// mu guards watchers and closed. Lock order: backend write lock, then
	// Fanout.mu, then BufferedWatcher.mu.
	mu       sync.Mutex
	watchers map[*BufferedWatcher]struct{}
	closed   bool
}

// NewFanout returns an empty Fanout.
func NewFanout() *Fanout {
	return &Fanout{watchers: make(map[*BufferedWatcher]struct{})}
}

// NewWatcher registers a watcher; OpInit is already queued. Call it while
// holding the backend's write lock (or at least before any write whose event
// the watcher must see) so "live" really means live.
func (f *Fanout) NewWatcher(ctx context.Context, watch Watch) (Watcher, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, trace.ConnectionProblem(nil, "backend is closed")
	}
	// If ctx is already done, the watcher closes itself right away, but on
	// context.AfterFunc's goroutine: its f.remove waits for f.mu, so it runs
	// after the insertion below and the map never keeps a closed watcher.
	w := NewBufferedWatcher(ctx, watch, f.remove)
	f.watchers[w] = struct{}{}
	return w, nil
}

func (f *Fanout) remove(w *BufferedWatcher) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.watchers, w)
}

// Emit delivers events, in order, to every matching watcher.
func (f *Fanout) Emit(events ...Event) {
	if len(events) == 0 {
		return
	}
	f.mu.Lock()
	var full []*BufferedWatcher
	for w := range f.watchers {
		for _, ev := range events {
			if !w.Matches(ev.Item.Key) {
				continue
			}
			if !w.tryPush(ev) {
				full = append(full, w)
				break
			}
		}
	}
	f.mu.Unlock()
	// Closing runs onClose (f.remove), which takes f.mu: do it unlocked.
	for _, w := range full {
		w.CloseWithError(trace.LimitExceeded(
			"watcher %q fell behind: its queue of %d events is full; the reader must re-sync",
			w.watch.Name, cap(w.events)))
	}
}

// tryPush is Push without the close on overflow: false means full (or
// already closed, in which case closing again is a no-op).
func (w *BufferedWatcher) tryPush(ev Event) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return true
	}
	select {
	case w.events <- ev:
		return true
	default:
		return false
	}
}

// Len returns the number of open watchers.
func (f *Fanout) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watchers)
}

// Close closes every watcher with a ConnectionProblem and refuses new ones.
func (f *Fanout) Close() {
	f.mu.Lock()
	f.closed = true
	ws := make([]*BufferedWatcher, 0, len(f.watchers))
	for w := range f.watchers {
		ws = append(ws, w)
	}
	f.watchers = map[*BufferedWatcher]struct{}{}
	f.mu.Unlock()
	for _, w := range ws {
		w.CloseWithError(trace.ConnectionProblem(nil, "backend is closed"))
	}
}

// RangeEnd returns the smallest key greater than every key that starts with
// prefix, so a prefix scan can be an indexed range [prefix, RangeEnd). It
// returns "" when there is no such key (prefix is all 0xff bytes): scan to
// the end. Keys compare byte-wise in Go, SQLite (BINARY collation) and etcd
// alike, which is what makes this correct everywhere.
func RangeEnd(prefix string) string {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return string(end[:i+1])
		}
	}
	return ""
}
