package test

import (
	"context"
	"sync"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// Outage wraps a real backend so that tests can take it down and bring it
// back, as an etcd that loses and regains its quorum: while down, every
// read and write fails with a ConnectionProblem, no watch starts, and the
// watches that were live break. It stands for the backend only: the code
// under test is unchanged.
type Outage struct {
	backend.Backend

	// mu guards down and watchers.
	mu       sync.Mutex
	down     bool
	watchers map[*outageWatcher]struct{}
}

// NewOutage wraps b; it starts up.
func NewOutage(b backend.Backend) *Outage {
	return &Outage{Backend: b, watchers: map[*outageWatcher]struct{}{}}
}

var errOutage = trace.ConnectionProblem(nil, "etcdserver: no leader (test outage)")

// Down takes the backend down: live watches break at once.
func (o *Outage) Down() {
	o.mu.Lock()
	o.down = true
	ws := o.watchers
	o.watchers = map[*outageWatcher]struct{}{}
	o.mu.Unlock()
	for w := range ws {
		w.breakWith(errOutage)
	}
}

// Up brings it back.
func (o *Outage) Up() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.down = false
}

func (o *Outage) check() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down {
		return errOutage
	}
	return nil
}

func (o *Outage) Get(ctx context.Context, key string) (*backend.Item, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	return o.Backend.Get(ctx, key)
}

func (o *Outage) GetRange(ctx context.Context, prefix string, limit int) ([]backend.Item, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	return o.Backend.GetRange(ctx, prefix, limit)
}

func (o *Outage) Put(ctx context.Context, item backend.Item) (*backend.Item, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	return o.Backend.Put(ctx, item)
}

func (o *Outage) Create(ctx context.Context, item backend.Item) (*backend.Item, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	return o.Backend.Create(ctx, item)
}

// CreateMany fails while down too. Without it a wrapped backend that
// batches (sqlite) would write through the outage: the embedded method
// would be promoted past the check.
func (o *Outage) CreateMany(ctx context.Context, items []backend.Item) (int, error) {
	if err := o.check(); err != nil {
		return 0, err
	}
	return backend.CreateMany(ctx, o.Backend, items)
}

func (o *Outage) CompareAndSwap(ctx context.Context, expected, replaceWith backend.Item) (*backend.Item, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	return o.Backend.CompareAndSwap(ctx, expected, replaceWith)
}

func (o *Outage) Delete(ctx context.Context, key string) error {
	if err := o.check(); err != nil {
		return err
	}
	return o.Backend.Delete(ctx, key)
}

func (o *Outage) DeleteRange(ctx context.Context, prefix string) error {
	if err := o.check(); err != nil {
		return err
	}
	return o.Backend.DeleteRange(ctx, prefix)
}

func (o *Outage) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down {
		return nil, errOutage
	}
	inner, err := o.Backend.NewWatcher(ctx, watch)
	if err != nil {
		return nil, err
	}
	w := &outageWatcher{Watcher: inner, done: make(chan struct{})}
	go func() {
		select {
		case <-inner.Done():
			w.breakWith(nil)
		case <-w.done:
		}
	}()
	o.watchers[w] = struct{}{}
	return w, nil
}

// outageWatcher is a live watch that the outage can break.
type outageWatcher struct {
	backend.Watcher
	once sync.Once
	done chan struct{}
	// mu guards err.
	mu  sync.Mutex
	err error
}

func (w *outageWatcher) Done() <-chan struct{} { return w.done }

func (w *outageWatcher) Error() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	return w.Watcher.Error()
}

func (w *outageWatcher) breakWith(err error) {
	w.once.Do(func() {
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		close(w.done)
		_ = w.Watcher.Close()
	})
}

func (w *outageWatcher) Close() error {
	w.breakWith(nil)
	return nil
}
