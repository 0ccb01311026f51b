package services

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backoff"
)

// WatchSource starts backend watches. A backend.Backend is one; so is
// anything that relays a backend's events (a later auth client).
type WatchSource interface {
	NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error)
}

// Collector receives what a ResourceWatcher sees. Its methods are called
// from the watcher's single goroutine, in order, never concurrently; the
// collector does its own locking towards its readers.
type Collector[T any] interface {
	// Reset replaces the whole view with items: called after every (re)load.
	Reset(items []T)
	// Put adds or replaces one resource.
	Put(item T)
	// Delete removes the resource stored at the backend key.
	Delete(key string)
}

// ResourceWatcherConfig configures a ResourceWatcher.
type ResourceWatcherConfig[T any] struct {
	// Name is used in logs and in watch names. Required.
	Name string
	// Source starts the backend watch. Required.
	Source WatchSource
	// Prefixes limits the watch to these key prefixes. Required: a
	// resource watcher never wants every key.
	Prefixes []string
	// Load reads the current set of resources. It is called after the
	// watch is live, so a write that lands during the load is both in the
	// load or after it, and in the event queue: nothing is lost. Required.
	Load func(ctx context.Context) ([]T, error)
	// Unmarshal turns a put event's item into a resource. Required.
	Unmarshal func(item backend.Item) (T, error)
	// Collector receives the resources. Required.
	Collector Collector[T]
	// QueueSize is the backend watch queue; zero means the backend default.
	QueueSize int
	// MinBackoff is the first wait before re-syncing a broken watch; it
	// doubles on each consecutive failure up to MaxBackoff, and each wait
	// is drawn from [d/2, d]. Zero means DefaultMinBackoff /
	// DefaultMaxBackoff.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// Clock drives the backoff. Nil means the real clock.
	Clock clockwork.Clock
	// Logger; nil means logrus with component "watcher:NAME".
	Logger logrus.FieldLogger
}

// Backoff bounds for re-syncing a broken watch. The top is what a backend
// outage costs after the backend is back: a process is unready (/readyz,
// the NodeWatcher) and answers from a stale view until its next attempt,
// so it must be short, and 30 s kept a proxy unready for ~20 s after etcd
// regained its quorum. At 1 s, with each wait drawn from [d/2, d] so that
// a fleet does not retry in lock step, every watch is current again within
// 2 s of the backend answering. An attempt is one watch and, once it is
// live, one read: against a backend that is down, that is one cheap
// failing request per watcher per second or less, which etcd and the auth
// API absorb for hundreds of processes.
const (
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = time.Second
)

// CheckAndSetDefaults validates the config.
func (c *ResourceWatcherConfig[T]) CheckAndSetDefaults() error {
	switch {
	case c.Name == "":
		return trace.BadParameter("resource watcher: missing Name")
	case c.Source == nil:
		return trace.BadParameter("resource watcher %s: missing Source", c.Name)
	case len(c.Prefixes) == 0:
		return trace.BadParameter("resource watcher %s: missing Prefixes", c.Name)
	case c.Load == nil:
		return trace.BadParameter("resource watcher %s: missing Load", c.Name)
	case c.Unmarshal == nil:
		return trace.BadParameter("resource watcher %s: missing Unmarshal", c.Name)
	case c.Collector == nil:
		return trace.BadParameter("resource watcher %s: missing Collector", c.Name)
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = logrus.WithField("component", "watcher:"+c.Name)
	}
	return nil
}

// ResourceWatcher keeps a Collector in sync with a backend prefix: watch
// first, wait for the watch to be live (OpInit), load the full set, then
// apply events in commit order. When the watch breaks it keeps the last
// good view, reports itself unhealthy, and re-syncs with exponential
// backoff. One implementation serves every resource kind.
type ResourceWatcher[T any] struct {
	cfg ResourceWatcherConfig[T]

	cancel context.CancelFunc
	done   chan struct{}
	// synced is closed after the first successful load.
	synced     chan struct{}
	syncedOnce sync.Once

	// mu guards health and brokeAt.
	mu     sync.Mutex
	health error
	// brokeAt is when health last went from nil to an error (zero while
	// healthy, and before the first sync).
	brokeAt time.Time

	failures atomic.Uint64
}

// NewResourceWatcher starts the watcher's goroutine; stop it with Close.
func NewResourceWatcher[T any](cfg ResourceWatcherConfig[T]) (*ResourceWatcher[T], error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	// The watcher owns its loop (Close ends it): no caller's context.
	ctx, cancel := context.WithCancel(context.Background())
	w := &ResourceWatcher[T]{
		cfg:    cfg,
		cancel: cancel,
		done:   make(chan struct{}),
		synced: make(chan struct{}),
		health: trace.ConnectionProblem(nil, "%s watcher has not synced yet", cfg.Name),
	}
	go w.run(ctx)
	return w, nil
}

// Close stops the watcher and waits for its goroutine to exit.
func (w *ResourceWatcher[T]) Close() error {
	w.cancel()
	<-w.done
	return nil
}

// Done is closed once the watcher has stopped.
func (w *ResourceWatcher[T]) Done() <-chan struct{} { return w.done }

// Synced is closed after the first successful load.
func (w *ResourceWatcher[T]) Synced() <-chan struct{} { return w.synced }

// WaitSynced blocks until the first load is done, ctx ends, or the watcher
// is closed.
func (w *ResourceWatcher[T]) WaitSynced(ctx context.Context) error {
	select {
	case <-w.synced:
		return nil
	default:
	}
	select {
	case <-w.synced:
		return nil
	case <-w.done:
		return trace.ConnectionProblem(nil, "%s watcher is closed", w.cfg.Name)
	case <-ctx.Done():
		return trace.ConnectionProblem(context.Cause(ctx), "%s watcher has not synced yet: %v", w.cfg.Name, context.Cause(ctx))
	}
}

// Healthy is nil while the watch is live and the view current; otherwise it
// says why not (not synced yet, or the broken watch's error). The view stays
// readable either way: stale beats empty for routing.
func (w *ResourceWatcher[T]) Healthy() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.health
}

// Failures counts watches that broke or syncs that failed.
func (w *ResourceWatcher[T]) Failures() uint64 { return w.failures.Load() }

func (w *ResourceWatcher[T]) setHealth(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.brokeAt = time.Time{}
	case w.health == nil && w.cfg.Clock != nil:
		w.brokeAt = w.cfg.Clock.Now()
	}
	w.health = err
}

// BrokenFor is how long the watch has been broken since it last was live,
// on the watcher's clock; ok is false while it is healthy or has never
// been live.
func (w *ResourceWatcher[T]) BrokenFor() (d time.Duration, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.health == nil || w.brokeAt.IsZero() {
		return 0, false
	}
	return w.cfg.Clock.Since(w.brokeAt), true
}

// state is, while the watch is broken after having been live, when it
// broke (zero otherwise), and Healthy: read together, so that a check
// does not pair one break's error with another's start.
func (w *ResourceWatcher[T]) state() (brokeAt time.Time, health error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.brokeAt, w.health
}

func (w *ResourceWatcher[T]) run(ctx context.Context) {
	defer close(w.done)
	bo := backoff.Backoff{Min: w.cfg.MinBackoff, Max: w.cfg.MaxBackoff, Jitter: true}
	for {
		synced, err := w.sync(ctx)
		if ctx.Err() != nil {
			return
		}
		if synced {
			// The watch was live for a while: start over from the
			// shortest wait.
			bo.Reset()
		}
		backoff := bo.Next()
		w.failures.Add(1)
		err = trace.ConnectionProblem(err, "%s watch broke: %v", w.cfg.Name, err)
		w.setHealth(err)
		w.cfg.Logger.WithError(err).WithField("backoff", backoff).Warn("Watch failed; keeping the last view and re-syncing.")
		t := w.cfg.Clock.NewTimer(backoff)
		select {
		case <-t.Chan():
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// sync runs one watch from start to break. synced reports whether the load
// succeeded (so the backoff resets).
func (w *ResourceWatcher[T]) sync(ctx context.Context) (synced bool, err error) {
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	bw, err := w.cfg.Source.NewWatcher(watchCtx, backend.Watch{
		Name:      w.cfg.Name,
		Prefixes:  w.cfg.Prefixes,
		QueueSize: w.cfg.QueueSize,
	})
	if err != nil {
		return false, trace.Wrap(err)
	}
	defer bw.Close()

	// 1. Wait until the watch is live: from here on, every write is queued.
	select {
	case ev := <-bw.Events():
		if ev.Type != backend.OpInit {
			return false, trace.BadParameter("first watch event is %v, want init", ev.Type)
		}
	case <-bw.Done():
		return false, watchErr(bw)
	case <-ctx.Done():
		return false, ctx.Err()
	}
	// 2. Load the current set. Writes racing with the load are in the
	// queue and get re-applied below, in order, converging on the truth.
	items, err := w.cfg.Load(watchCtx)
	if err != nil {
		return false, trace.Wrap(err)
	}
	w.cfg.Collector.Reset(items)
	w.setHealth(nil)
	w.syncedOnce.Do(func() { close(w.synced) })
	w.cfg.Logger.WithField("count", len(items)).Debug("Synced.")

	// 3. Apply events until the watch breaks or we are closed.
	for {
		select {
		case ev := <-bw.Events():
			w.apply(ev)
		case <-bw.Done():
			return true, watchErr(bw)
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}

func (w *ResourceWatcher[T]) apply(ev backend.Event) {
	switch ev.Type {
	case backend.OpPut:
		v, err := w.cfg.Unmarshal(ev.Item)
		if err != nil {
			// One corrupt record must not blind the watcher to all the
			// others; drop what we had under that key.
			w.cfg.Logger.WithError(err).WithField("key", ev.Item.Key).Warn("Skipping unreadable record.")
			w.cfg.Collector.Delete(ev.Item.Key)
			return
		}
		w.cfg.Collector.Put(v)
	case backend.OpDelete:
		w.cfg.Collector.Delete(ev.Item.Key)
	default:
		w.cfg.Logger.WithField("op", ev.Type).Debug("Ignoring unexpected event.")
	}
}

func watchErr(bw backend.Watcher) error {
	if err := bw.Error(); err != nil {
		return err
	}
	return trace.ConnectionProblem(nil, "watcher closed")
}
