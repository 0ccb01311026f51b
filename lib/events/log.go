package events

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backoff"
	"github.com/postern-dev/postern/lib/promreg"
)

// Defaults.
const (
	// FileName is the audit log in Config.Dir.
	FileName = "events.log"
	// DefaultTTL keeps events in the backend for 30 days: long enough to
	// investigate last month's incident with `pctl events ls`, short enough
	// that the backend (a single SQLite file by default, or etcd, whose
	// whole keyspace is held in memory) does not grow without bound. The
	// file in the data dir is kept for as long as the operator keeps it.
	DefaultTTL = 30 * 24 * time.Hour
	// DefaultQueueSize is how many events wait per sink while it is slow:
	// at ~300 bytes each, 4096 events are ~1 MB, minutes of a busy
	// cluster's activity, which rides out a backend election or a slow
	// fsync without dropping anything.
	DefaultQueueSize = 4096
	// DefaultBackendTimeout bounds one backend write, so that an
	// unreachable backend costs the queue a few seconds per event and
	// shows up as drops, rather than hanging the writer forever.
	DefaultBackendTimeout = 5 * time.Second
	// DefaultCloseGrace is how long Close lets the queues drain before it
	// gives up on the backend and the auth server (the file always
	// drains: it is local).
	DefaultCloseGrace = 5 * time.Second
	// DefaultBatchSize is how many events one shipment to auth carries at
	// most: a round trip per 100 events keeps a busy node's shipping
	// cheap, and a batch of 100 events (a few hundred bytes each, 4 KiB
	// per field at most) stays well under the auth API's 1 MiB body limit.
	DefaultBatchSize = 100
	// DefaultBatchWait is what a Postern process waits to fill a batch of
	// audit events: measured on a 2-core proxy setting up 50 SSH sessions
	// a second (4 events each with its node), one SQLite transaction per
	// event was ~30% of the process's CPU. 50 ms is far below anything a
	// person reading the audit log notices.
	DefaultBatchWait = 50 * time.Millisecond
	// maxBatchBytes bounds a batch by size as well, whatever the count: a
	// batch of events carrying long commands must still fit the auth
	// API's 1 MiB request limit with room for JSON overhead.
	maxBatchBytes = 256 << 10
	// DefaultRetryMin and DefaultRetryMax bound the backoff between
	// attempts to ship a batch while auth is unreachable: a second to
	// ride out a restart, at most 30 s between attempts so that events
	// arrive soon after auth is back, without a down auth server meeting
	// a reconnect storm from every node.
	DefaultRetryMin = time.Second
	DefaultRetryMax = 30 * time.Second
)

// Shipper sends events to the auth server, whose backend makes them
// searchable (lib/auth.Client implements it). Processes without the auth
// role have no backend of their own: without shipping, their events would
// only ever be in their local events.log.
type Shipper interface {
	ShipEvents(ctx context.Context, events []Event) error
}

// Config configures a Log.
type Config struct {
	// Dir is where events.log is written (DATA_DIR/log); created 0700 when
	// missing, the file 0600: audit records name users, addresses and
	// commands. Empty means no file.
	Dir string
	// Backend, when set, also stores events under /events/ with TTL, for
	// Search. Set it where the auth role (the backend's owner) runs.
	Backend backend.Backend
	// Remote, when set, also ships events in batches to the auth server.
	// Set it where the auth role does not run. A batch that cannot be
	// shipped is retried with backoff, on the Clock; meanwhile new events
	// wait in the queue, and past QueueSize they are dropped and counted,
	// never blocking a session. The auth server answers a batch it
	// refuses outright (BadParameter, AccessDenied, NotFound) once, and
	// that batch is dropped: retrying would never succeed.
	Remote Shipper
	// BatchSize bounds one shipment; zero means DefaultBatchSize.
	BatchSize int
	// BatchWait is how long a sink waits, after the first event of a
	// batch, for more to write with it (on the Clock); zero means none: a
	// batch is what is already queued. A flush, a full batch or Close ends
	// the wait. The audit log's cost is per write (an fsync, an HTTPS
	// request to auth), not per event, so under load a few milliseconds of
	// delay turn many writes into one. See DefaultBatchWait.
	BatchWait time.Duration
	// RetryMin and RetryMax bound the shipping backoff; zero means
	// DefaultRetryMin and DefaultRetryMax.
	RetryMin, RetryMax time.Duration
	// TTL of backend events; zero means DefaultTTL.
	TTL time.Duration
	// ClusterName fills Event.Cluster when an event has none.
	ClusterName string
	// QueueSize per sink; zero means DefaultQueueSize.
	QueueSize int
	// BackendTimeout; zero means DefaultBackendTimeout.
	BackendTimeout time.Duration
	// CloseGrace; zero means DefaultCloseGrace.
	CloseGrace time.Duration
	// Clock stamps events and times Close's grace; nil means the real clock.
	Clock clockwork.Clock
	// Logger; nil means logrus.WithField("component", "audit").
	Logger logrus.FieldLogger
	// Metrics registry; nil means a private one.
	Metrics prometheus.Registerer
}

// CheckAndSetDefaults validates and fills in defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.Dir == "" && c.Backend == nil && c.Remote == nil {
		return trace.BadParameter("events: none of Dir, Backend and Remote is set: events would go nowhere")
	}
	if c.TTL < 0 || c.QueueSize < 0 || c.BackendTimeout < 0 || c.CloseGrace < 0 ||
		c.BatchSize < 0 || c.BatchWait < 0 || c.RetryMin < 0 || c.RetryMax < 0 {
		return trace.BadParameter("events: negative TTL, QueueSize, BackendTimeout, CloseGrace, BatchSize, BatchWait, RetryMin or RetryMax")
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = c.RetryMin
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.BackendTimeout == 0 {
		c.BackendTimeout = DefaultBackendTimeout
	}
	if c.CloseGrace == 0 {
		c.CloseGrace = DefaultCloseGrace
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = logrus.WithField("component", "audit")
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
	}
	return nil
}

// Log is the audit log. Safe for concurrent use.
type Log struct {
	cfg     Config
	log     logrus.FieldLogger
	file    *os.File // nil without Dir
	sinks   []*sink
	metrics *logMetrics

	// ctx ends the sinks' writes when Close's grace runs out.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards closed against Emit's sends: Emit holds it for reading,
	// Close for writing while it closes the queues.
	mu     sync.RWMutex
	closed bool
}

// NewEmitter opens the audit log and starts its writers; Close stops them.
func NewEmitter(cfg Config) (*Log, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	m, err := newLogMetrics(cfg.Metrics)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	l := &Log{cfg: cfg, log: cfg.Logger, metrics: m}
	if cfg.Dir != "" {
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, trace.ConvertSystemError(err)
		}
		path := filepath.Join(cfg.Dir, FileName)
		// O_APPEND: each line is one write at the end of the file, so an
		// external `logrotate copytruncate` or a reader tailing it sees
		// whole lines.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, trace.ConvertSystemError(err)
		}
		l.file = f
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if l.file != nil {
		l.sinks = append(l.sinks, l.newSink("file", l.writeFile))
	}
	if cfg.Backend != nil {
		l.sinks = append(l.sinks, l.newSink("backend", l.writeBackend))
	}
	if cfg.Remote != nil {
		s := l.newSink("remote", nil)
		s.ship = cfg.Remote.ShipEvents
		l.sinks = append(l.sinks, s)
	}
	for _, s := range l.sinks {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			s.run()
		}()
	}
	return l, nil
}

// Emit queues e for every sink and returns at once.
func (l *Log) Emit(_ context.Context, e Event) {
	if e.Type == "" {
		l.log.WithField("fields", e.Fields).Warn("Audit event without a type; recorded as \"unknown\".")
		e.Type = "unknown"
	}
	if e.Time.IsZero() {
		e.Time = l.cfg.Clock.Now()
	}
	e.Time = e.Time.UTC()
	if e.ID == "" {
		e.ID = uuid.NewString()
	}
	if e.Cluster == "" {
		e.Cluster = l.cfg.ClusterName
	}
	line, _ := e.MarshalJSON() // never fails: see MarshalJSON
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		l.metrics.dropped.WithLabelValues("closed").Inc()
		return
	}
	l.metrics.emitted.WithLabelValues(e.Type).Inc()
	for _, s := range l.sinks {
		s.enqueue(record{event: e, line: line})
	}
}

// Flush waits until every event emitted before it has been written (or
// failed), or ctx is done. Tests use it; so can a shutdown path.
func (l *Log) Flush(ctx context.Context) error {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil
	}
	var acks []chan struct{}
	for _, s := range l.sinks {
		ack := make(chan struct{})
		select {
		case s.queue <- record{flushed: ack}:
			acks = append(acks, ack)
		case <-ctx.Done():
			l.mu.RUnlock()
			return trace.Wrap(ctx.Err())
		}
	}
	l.mu.RUnlock()
	for _, ack := range acks {
		select {
		case <-ack:
		case <-ctx.Done():
			return trace.Wrap(ctx.Err())
		}
	}
	return nil
}

// Close stops accepting events, lets the queues drain for CloseGrace, then
// abandons what the backend has not taken, closes the file and waits for
// the writers. Events emitted after Close are dropped and counted.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	for _, s := range l.sinks {
		close(s.queue)
	}
	l.mu.Unlock()

	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	timer := l.cfg.Clock.NewTimer(l.cfg.CloseGrace)
	select {
	case <-done:
		timer.Stop()
	case <-timer.Chan():
		l.log.Warn("Audit queues did not drain in time; abandoning the events still queued for the backend.")
		l.cancel()
		<-done
	}
	l.cancel()
	if l.file != nil {
		return trace.ConvertSystemError(l.file.Close())
	}
	return nil
}

// record is one queued item: an event, or a flush marker.
type record struct {
	event   Event
	line    []byte
	flushed chan struct{}
}

// sink is one destination with its own queue and writer goroutine, so that
// a slow backend never delays the file.
type sink struct {
	name  string
	l     *Log
	queue chan record
	// write writes a batch and says how many of its events it failed
	// to write.
	write func([]record) (failed int, err error)
	// ship, when set, replaces write: records are shipped in batches
	// (runBatches).
	ship func(context.Context, []Event) error
	// dropping is true from the first dropped event to the next queued
	// one: one Warn per streak of drops.
	dropping atomic.Bool
	// failing is the same for write errors; touched by the writer only.
	failing bool
}

func (l *Log) newSink(name string, write func([]record) (int, error)) *sink {
	return &sink{name: name, l: l, queue: make(chan record, l.cfg.QueueSize), write: write}
}

func (s *sink) enqueue(r record) {
	select {
	case s.queue <- r:
		if s.dropping.Swap(false) {
			s.l.log.WithField("sink", s.name).Info("Audit queue has room again.")
		}
	default:
		s.l.metrics.dropped.WithLabelValues(s.name).Inc()
		if !s.dropping.Swap(true) {
			s.l.log.WithFields(logrus.Fields{"sink": s.name, "event": r.event.Type}).
				Error("Audit queue is full: dropping events until it drains.")
		}
	}
}

func (s *sink) run() {
	if s.ship != nil {
		s.runBatches()
		return
	}
	// Events are written in batches (collect): one file write and one
	// backend transaction (one fsync) per batch instead of per event.
	// Under load (a proxy setting up hundreds of sessions a second, each
	// with its events) per-event writes were the largest part of the
	// process's CPU per connection.
	for r := range s.queue {
		batch, acks := s.collect(r)
		if len(batch) > 0 {
			s.writeBatch(batch)
		}
		for _, ack := range acks {
			close(ack)
		}
	}
}

// collect is the batch that starts with first: whatever is queued behind
// it, and for up to BatchWait what arrives, until the batch is full, a
// flush marker arrives (its ack is due once the batch is written) or the
// queue closes.
func (s *sink) collect(first record) (batch []record, acks []chan struct{}) {
	cfg := &s.l.cfg
	size := 0
	add := func(r record) {
		if r.flushed != nil {
			acks = append(acks, r.flushed)
			return
		}
		batch = append(batch, r)
		size += len(r.line)
	}
	add(first)
	full := func() bool { return len(batch) >= cfg.BatchSize || size >= maxBatchBytes }
	// drain takes what is queued already; false when the queue closed.
	drain := func() bool {
		for !full() {
			select {
			case r, ok := <-s.queue:
				if !ok {
					return false
				}
				add(r)
			default:
				return true
			}
		}
		return true
	}
	if !drain() || cfg.BatchWait <= 0 || len(acks) > 0 || full() {
		return batch, acks
	}
	timer := cfg.Clock.NewTimer(cfg.BatchWait)
	defer timer.Stop()
	for !full() && len(acks) == 0 {
		select {
		case r, ok := <-s.queue:
			if !ok {
				return batch, acks
			}
			add(r)
		case <-timer.Chan():
			drain()
			return batch, acks
		}
	}
	return batch, acks
}

// writeBatch writes one batch, counting each event not written as a write
// error (a failed write is not retried: see writeBackend).
func (s *sink) writeBatch(batch []record) {
	failed, err := s.write(batch)
	switch {
	case err != nil:
		s.l.metrics.writeErrors.WithLabelValues(s.name).Add(float64(failed))
		if !s.failing {
			s.failing = true
			s.l.log.WithError(err).WithField("sink", s.name).Error("Cannot write audit events; will keep trying.")
		}
	case s.failing:
		s.failing = false
		s.l.log.WithField("sink", s.name).Info("Audit events are being written again.")
	}
}

// runBatches ships what is queued in batches of up to BatchSize events
// (collect). A flush marker is acknowledged once the batch it arrived in has been
// shipped (or given up on).
func (s *sink) runBatches() {
	for r := range s.queue {
		batch, acks := s.collect(r)
		if len(batch) > 0 {
			events := make([]Event, len(batch))
			for i, r := range batch {
				events[i] = r.event
			}
			s.shipWithRetry(events)
		}
		for _, ack := range acks {
			close(ack)
		}
	}
}

// shipWithRetry ships one batch, retrying with backoff until it is taken,
// refused for good, or Close's grace runs out.
func (s *sink) shipWithRetry(batch []Event) {
	cfg := &s.l.cfg
	backoff := backoff.Backoff{Min: cfg.RetryMin, Max: cfg.RetryMax}
	for {
		ctx, cancel := context.WithTimeout(s.l.ctx, cfg.BackendTimeout)
		err := s.ship(ctx, batch)
		cancel()
		if err == nil {
			if s.failing {
				s.failing = false
				s.l.log.WithField("sink", s.name).Info("Audit events are being shipped to the auth server again.")
			}
			return
		}
		s.l.metrics.writeErrors.WithLabelValues(s.name).Inc()
		if permanentShipError(err) {
			s.l.metrics.dropped.WithLabelValues(s.name).Add(float64(len(batch)))
			s.l.log.WithError(err).WithFields(logrus.Fields{"sink": s.name, "events": len(batch)}).
				Error("The auth server refused a batch of audit events; dropped it.")
			return
		}
		if !s.failing {
			s.failing = true
			s.l.log.WithError(err).WithField("sink", s.name).Error("Cannot ship audit events to the auth server; will keep trying.")
		}
		timer := cfg.Clock.NewTimer(backoff.Next())
		select {
		case <-timer.Chan():
		case <-s.l.ctx.Done():
			timer.Stop()
			s.l.metrics.dropped.WithLabelValues(s.name).Add(float64(len(batch)))
			return
		}
	}
}

// permanentShipError says a retry cannot succeed: the auth server
// understood the batch and refused it (or has no such endpoint).
func permanentShipError(err error) bool {
	return trace.IsBadParameter(err) || trace.IsAccessDenied(err) || trace.IsNotFound(err) || trace.IsNotImplemented(err)
}

// writeFile appends the batch's lines in one write: O_APPEND keeps each
// write whole at the end of the file, so readers still see whole lines.
func (l *Log) writeFile(batch []record) (int, error) {
	n := 0
	for _, r := range batch {
		n += len(r.line) + 1
	}
	buf := make([]byte, 0, n)
	for _, r := range batch {
		buf = append(append(buf, r.line...), '\n')
	}
	if _, err := l.file.Write(buf); err != nil {
		return len(batch), trace.ConvertSystemError(err)
	}
	return 0, nil
}

// writeBackend creates the batch's events in one backend.CreateMany. A
// failure is counted and logged, not retried: the file sink has the
// events, and a retry queue in front of a backend that is down would only
// grow.
func (l *Log) writeBackend(batch []record) (int, error) {
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.BackendTimeout)
	defer cancel()
	// Create, not Put: an event is written once. A batch a host shipped
	// again (its first answer was lost) carries the same ids and times,
	// so the copy is skipped here instead of doubling the record, and no
	// event can overwrite another.
	items := make([]backend.Item, len(batch))
	for i, r := range batch {
		items[i] = backend.Item{
			Key:     eventKey(r.event),
			Value:   r.line,
			Expires: r.event.Time.Add(l.cfg.TTL),
		}
	}
	n, err := backend.CreateMany(ctx, l.cfg.Backend, items)
	if err != nil {
		return len(batch) - n, trace.Wrap(err)
	}
	return 0, nil
}

type logMetrics struct {
	emitted     *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	writeErrors *prometheus.CounterVec
}

func newLogMetrics(reg prometheus.Registerer) (*logMetrics, error) {
	m := &logMetrics{
		emitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "audit", Name: "events_total",
			Help: "Audit events emitted, by type.",
		}, []string{"event"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "audit", Name: "dropped_total",
			Help: "Audit events dropped because a sink's queue was full (or the log closed), by sink.",
		}, []string{"sink"}),
		writeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "audit", Name: "write_errors_total",
			Help: "Audit events a sink failed to write, by sink.",
		}, []string{"sink"}),
	}
	for _, c := range []**prometheus.CounterVec{&m.emitted, &m.dropped, &m.writeErrors} {
		// A second Log on the same registry (a role restarted in tests)
		// shares the series instead of failing.
		var err error
		if *c, err = promreg.Register(reg, *c); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	return m, nil
}

// flushFor waits until every record queued on this sink before it has been
// handled; Log.mu must not be held for writing (the queue must be open).
func (s *sink) flushFor(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case s.queue <- record{flushed: ack}:
	case <-ctx.Done():
		return trace.Wrap(ctx.Err())
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return trace.Wrap(ctx.Err())
	}
}
