// Package export sends a copy of a process's audit events where the
// operator keeps logs: a file of JSON lines for a log shipper (file.go),
// and a webhook taking batches of JSON lines, for a SIEM (webhook.go).
//
// The audit log in the data dir (lib/events) stays the record of truth;
// an export is a copy, so it is shaped to never cost a session anything:
// each exporter has a bounded in-memory queue and one goroutine that
// writes from it. Export (called by events.Log.Emit on the session's
// goroutine) only tries to queue the event: when the queue is full the
// event is dropped and counted in postern_audit_dropped_total, never
// waited for.
//
// A full queue drops the newest event, not the oldest: what is queued
// stays a contiguous, ordered run of the log, so the copy has one gap per
// overload (between two event times an operator can read, and refill
// from events.log) instead of a hole at its head that keeps moving, and
// Export never has to take from the writer's end of the queue. It is
// also what the Log's own sinks do.
package export

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/promreg"
)

// Defaults.
const (
	// DefaultQueueSize is how many events wait for an exporter: ~3 MB at
	// ~300 bytes an event, minutes of a busy proxy's events, enough to
	// ride out a SIEM's restart without a drop.
	DefaultQueueSize = 10000
	// DefaultBatchSize bounds one webhook request (and one file write):
	// a batch is whatever queued while the previous one was delivered, up
	// to this many events or maxBatchBytes.
	DefaultBatchSize = 500
	// DefaultTimeout bounds one webhook request: a SIEM that hangs is
	// retried rather than holding the queue forever.
	DefaultTimeout = 10 * time.Second
	// DefaultRetryMin and DefaultRetryMax bound the backoff between
	// attempts to deliver a batch the webhook failed: a second to ride
	// out a restart, at most a minute so that events flow soon after it
	// is back without every host of a fleet hammering it meanwhile.
	DefaultRetryMin = time.Second
	DefaultRetryMax = time.Minute
	// DefaultMaxFiles is how many files rotation by size keeps besides
	// the live one.
	DefaultMaxFiles = 5
	// maxBatchBytes bounds a batch whatever its count: collectors often
	// refuse bodies past a few MB.
	maxBatchBytes = 1 << 20
)

// Sink names, the sink label of the metrics.
const (
	SinkFile    = "export_file"
	SinkWebhook = "webhook"
)

// Config configures a process's exporters.
type Config struct {
	// File, when set, is the path events are appended to as JSON lines.
	File string
	// Webhook, when set, is the URL batches are POSTed to.
	Webhook string
	// CAFile, when set, verifies the webhook's certificate instead of the
	// system's roots.
	CAFile string
	// MaxSizeBytes, when positive, rotates File once it reaches that size
	// (file.go); MaxFiles rotated files are kept, zero meaning
	// DefaultMaxFiles.
	MaxSizeBytes int64
	MaxFiles     int
	// QueueSize per exporter; zero means DefaultQueueSize.
	QueueSize int
	// BatchSize; zero means DefaultBatchSize.
	BatchSize int
	// Timeout of one webhook request; zero means DefaultTimeout.
	Timeout time.Duration
	// RetryMin and RetryMax bound the webhook's backoff; zero means the
	// defaults.
	RetryMin, RetryMax time.Duration
	// Deps: Clock times retries and requests; Metrics gets the export
	// counters. Audit is not used (an exporter is where audit goes).
	observe.Deps
}

// CheckAndSetDefaults validates and fills in defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.QueueSize < 0 || c.BatchSize < 0 || c.Timeout < 0 || c.RetryMin < 0 || c.RetryMax < 0 {
		return trace.BadParameter("audit export: negative QueueSize, BatchSize, Timeout, RetryMin or RetryMax")
	}
	if c.MaxSizeBytes < 0 || c.MaxFiles < 0 {
		return trace.BadParameter("audit export: negative MaxSizeBytes or MaxFiles")
	}
	if c.MaxFiles == 0 {
		c.MaxFiles = DefaultMaxFiles
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	c.RetryMax = max(c.RetryMax, c.RetryMin)
	c.Deps.SetDefaults(observe.ComponentAudit)
	return nil
}

// New starts the exporters cfg asks for (none when neither File nor
// Webhook is set), for events.Config.Exporters, which closes them.
func New(cfg Config) ([]events.Exporter, error) {
	if cfg.File == "" && cfg.Webhook == "" {
		return nil, nil
	}
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	var out []events.Exporter
	if cfg.File != "" {
		f, err := NewFile(cfg)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		out = append(out, f)
	}
	if cfg.Webhook != "" {
		w, err := NewWebhook(cfg)
		if err != nil {
			for _, x := range out {
				closeNow(x)
			}
			return nil, trace.Wrap(err)
		}
		out = append(out, w)
	}
	return out, nil
}

func closeNow(x events.Exporter) {
	// An already-ended context: close at once, nothing to wait for.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	x.Close(ctx)
}

var (
	_ events.Exporter = (*File)(nil)
	_ events.Exporter = (*Webhook)(nil)
)

// metrics are one exporter's series.
type metrics struct {
	length  prometheus.Gauge
	dropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, sink string) (*metrics, error) {
	length, err := promreg.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "postern", Subsystem: "audit", Name: "queue_length",
		Help: "Audit events waiting for an exporter (sink=export_file or webhook), the batch being delivered included.",
	}, []string{"sink"}))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	dropped, err := events.DroppedCounter(reg)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &metrics{length: length.WithLabelValues(sink), dropped: dropped.WithLabelValues(sink)}, nil
}

// item is one queued event, or something for the writer to do once what
// was queued before it is delivered (a flush's ack, a reopen).
type item struct {
	line []byte
	then func()
}

// queue is an exporter's bounded queue and the goroutine that empties it
// in batches through deliver. deliver gets ctx, which ends when Close's
// time is up, and returns how many events of the batch it dropped
// (counted here).
type queue struct {
	name    string
	log     logrus.FieldLogger
	m       *metrics
	size    int // batch size
	ch      chan item
	deliver func(ctx context.Context, batch [][]byte) (dropped int)

	// mu guards closed against Export's sends.
	mu     sync.RWMutex
	closed bool
	// dropping is true from a drop to the next event queued: one log
	// line per streak of drops.
	dropping atomic.Bool

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newQueue(cfg *Config, name string, deliver func(context.Context, [][]byte) int) (*queue, error) {
	m, err := newMetrics(cfg.Metrics, name)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	q := &queue{
		name: name, log: cfg.Logger.WithField("sink", name), m: m, size: cfg.BatchSize,
		ch: make(chan item, cfg.QueueSize), deliver: deliver, done: make(chan struct{}),
	}
	// The queue owns its deliveries (Close ends them), past the events' emitters.
	q.ctx, q.cancel = context.WithCancel(context.Background())
	return q, nil
}

func (q *queue) start() { go q.run() }

// Export queues line, or drops and counts it when the queue is full.
func (q *queue) Export(line []byte) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		q.m.dropped.Inc()
		return
	}
	select {
	case q.ch <- item{line: line}:
		q.m.length.Inc()
		if q.dropping.Swap(false) {
			q.log.Info("Audit export queue has room again.")
		}
	default:
		q.m.dropped.Inc()
		if !q.dropping.Swap(true) {
			q.log.Error("Audit export queue is full: dropping events until it drains (events.log in the data dir has them all).")
		}
	}
}

// Flush waits until everything queued before it has been delivered (or
// dropped), or ctx is done. While it waits for room in a full queue it
// holds off Close (and so, on the RWMutex, Export): it is for tests and
// tools, never for a path a session is on; the Log does not call it.
func (q *queue) Flush(ctx context.Context) error {
	ack := make(chan struct{})
	q.mu.RLock()
	if q.closed {
		q.mu.RUnlock()
		return trace.BadParameter("audit exporter %s is closed", q.name)
	}
	select {
	case q.ch <- item{then: func() { close(ack) }}:
	case <-ctx.Done():
		q.mu.RUnlock()
		return trace.Wrap(ctx.Err())
	}
	q.mu.RUnlock()
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return trace.Wrap(ctx.Err())
	}
}

// Close stops taking events and delivers what is queued until ctx is
// done; then it gives up on the rest (counted as dropped) and waits for
// the goroutine to stop.
func (q *queue) Close(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
	q.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		q.cancel()
		<-q.done
	}
	q.cancel()
	return nil
}

func (q *queue) run() {
	defer close(q.done)
	for it := range q.ch {
		batch, then := q.collect(it)
		if len(batch) > 0 {
			n := len(batch)
			if q.ctx.Err() != nil {
				q.m.dropped.Add(float64(n)) // Close's time is up
			} else if dropped := q.deliver(q.ctx, batch); dropped > 0 {
				q.m.dropped.Add(float64(dropped))
			}
			q.m.length.Sub(float64(n))
		}
		for _, f := range then {
			f()
		}
	}
}

// collect is the batch that starts with first and whatever is queued
// behind it, up to the batch size or maxBatchBytes, or an item with
// something to do after it.
func (q *queue) collect(first item) (batch [][]byte, then []func()) {
	size := 0
	add := func(it item) {
		if it.then != nil {
			then = append(then, it.then)
			return
		}
		batch = append(batch, it.line)
		size += len(it.line) + 1
	}
	add(first)
	for len(then) == 0 && len(batch) < q.size && size < maxBatchBytes {
		select {
		case it, ok := <-q.ch:
			if !ok {
				return batch, then
			}
			add(it)
		default:
			return batch, then
		}
	}
	return batch, then
}

// joinLines is a batch as JSON lines, each ended by a newline.
func joinLines(batch [][]byte) []byte {
	n := 0
	for _, l := range batch {
		n += len(l) + 1
	}
	buf := make([]byte, 0, n)
	for _, l := range batch {
		buf = append(append(buf, l...), '\n')
	}
	return buf
}
