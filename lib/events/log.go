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
	// DefaultQueueSize is how many events wait for the file (and, in a
	// Log without a Dir, for the backend or the auth server) while it is
	// slow: at ~300 bytes each, 4096 events are ~1 MB, minutes of a busy
	// cluster's activity, which rides out a slow fsync without dropping
	// anything. With a Dir, the backend and the auth server are fed from
	// the file and have no queue to overflow (wal.go).
	DefaultQueueSize = 4096
	// DefaultBackendTimeout bounds one backend write (or shipment), so
	// that a backend that hangs is retried rather than hanging the writer
	// forever.
	DefaultBackendTimeout = 5 * time.Second
	// DefaultCloseGrace is how long Close lets the backend and the auth
	// server catch up before it stops waiting for them (the file always
	// drains: it is local; what they did not take is replayed from it at
	// the next start).
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
	// attempts to store a batch while the backend or auth is unreachable:
	// a second to ride out a restart, at most 30 s between attempts so
	// that events arrive soon after it is back, without a down auth
	// server meeting a reconnect storm from every node.
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
	// Search. Set it where the auth role (the backend's owner) runs. A
	// batch the backend fails is retried with backoff, on the Clock, until
	// it is stored; with a Dir, across restarts too (wal.go).
	Backend backend.Backend
	// Remote, when set, also ships events in batches to the auth server.
	// Set it where the auth role does not run. A batch that cannot be
	// shipped is retried with backoff, on the Clock; meanwhile new events
	// wait in the file (with a Dir; without one, in a queue of QueueSize,
	// past which they are dropped and counted), never blocking a session.
	// The auth server answers a batch it refuses outright (BadParameter,
	// AccessDenied, NotFound) once, and that batch is dropped: retrying
	// would never succeed.
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
	// RetryMin and RetryMax bound the backend's and shipping's backoff; zero means
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
	//
	// Clock, Logger and Metrics are not observe.Deps: observe imports
	// events (Deps.Audit is an Emitter), and events is one of the few
	// packages lib/api may import (TestLeaf in lib/api), so events
	// importing observe would pull the OpenTelemetry API into every
	// client of the wire types. Moving Emitter to a package of its own
	// breaks the cycle but not the leaf rule.
	Clock clockwork.Clock
	// Logger; nil means logrus.WithField("component", "audit").
	Logger logrus.FieldLogger
	// Metrics registry; nil means a private one.
	Metrics prometheus.Registerer
	// Exporters get a copy of every event this process emits (Emit, not
	// the batches other hosts ship to Store: each host exports its own,
	// so a SIEM fed by every host gets each event once). The Log owns
	// them from NewEmitter on: it closes them in Close, within
	// CloseGrace, and on NewEmitter's failure.
	Exporters []Exporter
}

// Exporter sends a copy of the audit log where the operator keeps logs
// (lib/events/export: a file for a log shipper, a webhook). Export is
// called for every emitted event, on the session's goroutine, so it must
// return at once: queue or drop, never wait on a disk or the network.
type Exporter interface {
	// Export takes one event, encoded as its JSON line (no newline).
	// The line is shared: an Exporter must not modify it.
	Export(line []byte)
	// Close delivers what is queued until ctx is done, then drops (and
	// counts) the rest and stops. Export is not called during or after it.
	Close(ctx context.Context) error
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
	file    *os.File // nil without Dir; read (ReadAt) by the followers too
	metrics *logMetrics

	// sinks are fed by Emit through their queues: the file's always (it
	// is sinks[0] when there is a Dir), the backend's and the remote's
	// only without a Dir. followers read the file instead (wal.go).
	sinks     []*sink
	followers []*sink
	// durable are the sinks postern_audit_pending is kept for (backend
	// and remote, followers or not).
	durable []*sink

	// fileEnd is the size of the file as of its last write by the file
	// sink: what followers may read up to. fileDone is closed when the
	// file sink has written its last batch (after Close).
	fileEnd  atomic.Int64
	fileDone chan struct{}
	// queued counts events in the file sink's queue: emitted, not yet in
	// the file, so pending for every follower.
	queued atomic.Int64
	// pendingMu orders the pending gauge's updates, so that the last one
	// set is the latest value.
	pendingMu sync.Mutex

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
// With a Dir, events the backend or the auth server had not taken when the
// previous process stopped are replayed to them from the file (wal.go).
func NewEmitter(cfg Config) (*Log, error) {
	l, err := newLog(cfg)
	if err != nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // nothing was exported yet: nothing to wait for
		for _, x := range cfg.Exporters {
			x.Close(ctx)
		}
		return nil, trace.Wrap(err)
	}
	return l, nil
}

func newLog(cfg Config) (*Log, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	m, err := newLogMetrics(cfg.Metrics)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	l := &Log{cfg: cfg, log: cfg.Logger, metrics: m, fileDone: make(chan struct{})}
	// The log owns its sinks' lifetime (Close ends it): events outlive the requests that emit them.
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if cfg.Dir != "" {
		if err := l.openFile(); err != nil {
			l.cancel()
			return nil, trace.Wrap(err)
		}
		l.sinks = append(l.sinks, l.newSink("file", l.writeFile))
	} else {
		close(l.fileDone)
	}
	var durable []*sink
	if cfg.Backend != nil {
		durable = append(durable, &sink{name: "backend", l: l, deliver: l.writeBackend})
	}
	if cfg.Remote != nil {
		durable = append(durable, &sink{name: "remote", l: l, deliver: l.shipBatch, permanent: permanentShipError})
	}
	for _, s := range durable {
		if l.file != nil {
			if err := s.openCursor(); err != nil {
				l.cancel()
				l.file.Close()
				return nil, trace.Wrap(err)
			}
			l.followers = append(l.followers, s)
		} else {
			s.queue = make(chan record, cfg.QueueSize)
			l.sinks = append(l.sinks, s)
		}
		l.durable = append(l.durable, s)
	}
	l.updatePending()
	for _, s := range l.sinks {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			s.run()
			if s.name == "file" {
				close(l.fileDone)
			}
		}()
	}
	for _, s := range l.followers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer close(s.done)
			s.follow()
		}()
	}
	return l, nil
}

// openFile opens (creates) events.log for appending and reading, ending a
// line a crash left half written so that the next event starts a line of
// its own.
func (l *Log) openFile() error {
	if err := os.MkdirAll(l.cfg.Dir, 0o700); err != nil {
		return trace.ConvertSystemError(err)
	}
	path := filepath.Join(l.cfg.Dir, FileName)
	// O_APPEND: each line is one write at the end of the file, so an
	// external `logrotate copytruncate` or a reader tailing it sees
	// whole lines. O_RDWR: the followers read it back (ReadAt, which
	// O_APPEND does not affect).
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return trace.ConvertSystemError(err)
	}
	size := fi.Size()
	if size > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, size-1); err != nil {
			f.Close()
			return trace.ConvertSystemError(err)
		}
		if last[0] != '\n' {
			if _, err := f.Write([]byte{'\n'}); err != nil {
				f.Close()
				return trace.ConvertSystemError(err)
			}
			size++
		}
	}
	l.file = f
	l.fileEnd.Store(size)
	return nil
}

// prepare fills in what an event left out and encodes it.
func (l *Log) prepare(e Event) (Event, []byte) {
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
	return e, line
}

// Emit queues e for every sink and exporter and returns at once.
func (l *Log) Emit(_ context.Context, e Event) {
	e, line := l.prepare(e)
	l.emit(e, line, true)
}

// emit is the one path of every event into the log: Emit's, and Store's
// for the events other hosts ship (export false: they export their own).
func (l *Log) emit(e Event, line []byte, export bool) {
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
	if export {
		for _, x := range l.cfg.Exporters {
			x.Export(line)
		}
	}
	l.updatePending()
}

// Storer is what the auth server needs to acknowledge a batch a host
// shipped only once it is stored: *Log implements it where it has a
// Backend.
type Storer interface {
	Store(ctx context.Context, events []Event) error
}

var _ Storer = (*Log)(nil)

// Store records events like Emit (file, backend) and also writes them to
// the backend itself, returning once the backend has them, within
// BackendTimeout: a host that shipped them drops its copy only then. The
// backend sink writes them again from the file later; that copy is
// skipped (Create), the price of keeping the file the one log the backend
// follows. A backend error is a ConnectionProblem: the shipper keeps the
// batch and retries.
func (l *Log) Store(ctx context.Context, es []Event) error {
	if l.cfg.Backend == nil {
		return trace.NotImplemented("this audit log has no backend to store events in")
	}
	items := make([]backend.Item, 0, len(es))
	for _, e := range es {
		e, line := l.prepare(e)
		l.emit(e, line, false)
		items = append(items, l.backendItem(e, line))
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.BackendTimeout)
	defer cancel()
	if _, err := backend.CreateMany(ctx, l.cfg.Backend, items); err != nil {
		return trace.ConnectionProblem(err, "the audit backend did not store %d events: %v", len(items), err)
	}
	return nil
}

// Flush waits until every event emitted before it has been written by
// every sink (the file: or failed; the backend and the auth server: taken,
// or refused for good), or ctx is done. While the backend is down it waits
// for ctx. Tests use it; so can a shutdown path.
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
	target := l.fileEnd.Load()
	for _, s := range l.followers {
		if err := s.waitAcked(ctx, target); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// Close stops accepting events, lets the file drain and the backend and
// the auth server catch up for CloseGrace, then stops waiting for them,
// closes the file and waits for the writers. With a Dir, what they did not
// take is still in the file, past their cursors: the next start replays
// it. Events emitted after Close are dropped and counted.
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

	// The exporters flush beside the sinks, within the same grace.
	exportCtx, exportCancel := context.WithCancel(context.Background())
	defer exportCancel()
	var exporters sync.WaitGroup
	for _, x := range l.cfg.Exporters {
		exporters.Add(1)
		go func() {
			defer exporters.Done()
			if err := x.Close(exportCtx); err != nil {
				l.log.WithError(err).Warn("Closing an audit exporter failed.")
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		exporters.Wait()
		close(done)
	}()
	timer := l.cfg.Clock.NewTimer(l.cfg.CloseGrace)
	select {
	case <-done:
		timer.Stop()
	case <-timer.Chan():
		if l.file != nil {
			l.log.Warn("Audit events were not all stored in time; the next start replays them from the file.")
		} else {
			l.log.Warn("Audit queues did not drain in time; abandoning the events still queued for the backend.")
		}
		l.cancel()
		exportCancel()
		<-done
	}
	l.cancel()
	if l.file != nil {
		return trace.ConvertSystemError(l.file.Close())
	}
	return nil
}

type logMetrics struct {
	emitted     *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	writeErrors *prometheus.CounterVec
	pending     *prometheus.GaugeVec
}

func newLogMetrics(reg prometheus.Registerer) (*logMetrics, error) {
	m := &logMetrics{
		emitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "audit", Name: "events_total",
			Help: "Audit events emitted, by type.",
		}, []string{"event"}),
		dropped: newDropped(),
		writeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "audit", Name: "write_errors_total",
			Help: "Audit events a sink failed to write, by sink.",
		}, []string{"sink"}),
	}
	pending := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "postern", Subsystem: "audit", Name: "pending",
		Help: "Audit events emitted and not yet stored by the backend (sink=backend) or taken by the auth server (sink=remote).",
	}, []string{"sink"})
	var err error
	if m.pending, err = promreg.Register(reg, pending); err != nil {
		return nil, trace.Wrap(err)
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

func newDropped() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "postern", Subsystem: "audit", Name: "dropped_total",
		Help: "Audit events dropped because a sink's queue was full (or the log closed), by sink.",
	}, []string{"sink"})
}

// DroppedCounter is postern_audit_dropped_total on reg, the one the Log
// counts its drops in: the exporters count theirs there too (by their sink
// name), so that one series answers "was anything lost".
func DroppedCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c, err := promreg.Register(reg, newDropped())
	return c, trace.Wrap(err)
}
