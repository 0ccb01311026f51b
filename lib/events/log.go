package events

import (
	"context"
	"errors"
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
	// gives up on the backend (the file always drains: it is local).
	DefaultCloseGrace = 5 * time.Second
)

// Config configures a Log.
type Config struct {
	// Dir is where events.log is written (DATA_DIR/log); created 0700 when
	// missing, the file 0600: audit records name users, addresses and
	// commands. Empty means no file.
	Dir string
	// Backend, when set, also stores events under /events/ with TTL, for
	// Search. Set it where the auth role (the backend's owner) runs.
	Backend backend.Backend
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
	if c.Dir == "" && c.Backend == nil {
		return trace.BadParameter("events: neither Dir nor Backend is set: events would go nowhere")
	}
	if c.TTL < 0 || c.QueueSize < 0 || c.BackendTimeout < 0 || c.CloseGrace < 0 {
		return trace.BadParameter("events: negative TTL, QueueSize, BackendTimeout or CloseGrace")
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
	write func(record) error
	// dropping is true from the first dropped event to the next queued
	// one: one Warn per streak of drops.
	dropping atomic.Bool
	// failing is the same for write errors; touched by the writer only.
	failing bool
}

func (l *Log) newSink(name string, write func(record) error) *sink {
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
	for r := range s.queue {
		if r.flushed != nil {
			close(r.flushed)
			continue
		}
		err := s.write(r)
		switch {
		case err != nil:
			s.l.metrics.writeErrors.WithLabelValues(s.name).Inc()
			if !s.failing {
				s.failing = true
				s.l.log.WithError(err).WithField("sink", s.name).Error("Cannot write audit events; will keep trying.")
			}
		case s.failing:
			s.failing = false
			s.l.log.WithField("sink", s.name).Info("Audit events are being written again.")
		}
	}
}

func (l *Log) writeFile(r record) error {
	line := make([]byte, 0, len(r.line)+1)
	line = append(append(line, r.line...), '\n')
	_, err := l.file.Write(line)
	return trace.ConvertSystemError(err)
}

func (l *Log) writeBackend(r record) error {
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.BackendTimeout)
	defer cancel()
	_, err := l.cfg.Backend.Put(ctx, backend.Item{
		Key:     eventKey(r.event),
		Value:   r.line,
		Expires: r.event.Time.Add(l.cfg.TTL),
	})
	return trace.Wrap(err)
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
		if err := reg.Register(*c); err != nil {
			// A second Log on the same registry (a role restarted in
			// tests) shares the series instead of failing.
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, trace.Wrap(err)
			}
			existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
			if !ok {
				return nil, trace.Wrap(err)
			}
			*c = existing
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
