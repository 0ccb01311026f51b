package backend

import (
	"context"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// Instrumented wraps a Backend and records how long each operation takes
// and how many fail, so that an operator can tell "the proxy is slow" from
// "etcd is slow" on /metrics. Watchers are passed through untouched: their
// latency is the writers'.
type Instrumented struct {
	Backend
	clock   clockwork.Clock
	latency *prometheus.HistogramVec
	errors  *prometheus.CounterVec
}

// NewInstrumented wraps b, registering its metrics on reg. clock times the
// operations; nil means the real clock, which is what an operator wants even
// when the rest of a test process runs on a fake one.
func NewInstrumented(b Backend, reg prometheus.Registerer, clock clockwork.Clock) (*Instrumented, error) {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	i := &Instrumented{
		Backend: b,
		clock:   clock,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "postern", Subsystem: "backend", Name: "request_duration_seconds",
			Help: "Time spent in backend operations, by operation.",
			// From a memory read (microseconds) to a slow etcd write over a
			// WAN (seconds).
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "backend", Name: "errors_total",
			Help: "Backend operations that failed for another reason than NotFound, AlreadyExists or CompareFailed.",
		}, []string{"op"}),
	}
	for _, c := range []prometheus.Collector{i.latency, i.errors} {
		if err := reg.Register(c); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	return i, nil
}

// observe records one operation.
func (i *Instrumented) observe(op string, start time.Time, err error) {
	i.latency.WithLabelValues(op).Observe(i.clock.Since(start).Seconds())
	if err != nil && !trace.IsNotFound(err) && !trace.IsAlreadyExists(err) && !trace.IsCompareFailed(err) {
		i.errors.WithLabelValues(op).Inc()
	}
}

func (i *Instrumented) Get(ctx context.Context, key string) (*Item, error) {
	start := i.clock.Now()
	it, err := i.Backend.Get(ctx, key)
	i.observe("get", start, err)
	return it, err
}

func (i *Instrumented) GetRange(ctx context.Context, prefix string, limit int) ([]Item, error) {
	start := i.clock.Now()
	items, err := i.Backend.GetRange(ctx, prefix, limit)
	i.observe("get_range", start, err)
	return items, err
}

func (i *Instrumented) Put(ctx context.Context, item Item) (*Item, error) {
	start := i.clock.Now()
	it, err := i.Backend.Put(ctx, item)
	i.observe("put", start, err)
	return it, err
}

func (i *Instrumented) Create(ctx context.Context, item Item) (*Item, error) {
	start := i.clock.Now()
	it, err := i.Backend.Create(ctx, item)
	i.observe("create", start, err)
	return it, err
}

func (i *Instrumented) CompareAndSwap(ctx context.Context, expected Item, replaceWith Item) (*Item, error) {
	start := i.clock.Now()
	it, err := i.Backend.CompareAndSwap(ctx, expected, replaceWith)
	i.observe("compare_and_swap", start, err)
	return it, err
}

func (i *Instrumented) Delete(ctx context.Context, key string) error {
	start := i.clock.Now()
	err := i.Backend.Delete(ctx, key)
	i.observe("delete", start, err)
	return err
}

func (i *Instrumented) DeleteRange(ctx context.Context, prefix string) error {
	start := i.clock.Now()
	err := i.Backend.DeleteRange(ctx, prefix)
	i.observe("delete_range", start, err)
	return err
}

// Clock is the wrapped backend's.
func (i *Instrumented) Clock() clockwork.Clock { return i.Backend.Clock() }

var _ Backend = (*Instrumented)(nil)

// CreateMany implements BatchCreator: the wrapped backend's batch path when
// it has one, one Create at a time otherwise.
func (i *Instrumented) CreateMany(ctx context.Context, items []Item) (int, error) {
	start := i.clock.Now()
	n, err := CreateMany(ctx, i.Backend, items)
	i.observe("create_many", start, err)
	return n, err
}

// Snapshot implements Snapshotter through the wrapped backend (a backup
// must not fall back to one big GetRange because of this wrapper).
func (i *Instrumented) Snapshot(ctx context.Context, fn func(Item) error) error {
	start := i.clock.Now()
	err := Snapshot(ctx, i.Backend, fn)
	i.observe("snapshot", start, err)
	return trace.Wrap(err)
}
