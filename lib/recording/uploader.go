package recording

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/postern-dev/postern/lib/backoff"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/promreg"
)

// ChunkUploader ships one chunk to the auth server (auth.Client) and
// says what the cluster's store already holds of a session, so that an
// upload resumes from the store rather than from what this node
// believes it shipped (the two differ after a failover to an auth server
// that does not share the first one's store, or after a restart).
type ChunkUploader interface {
	PutRecordingChunk(ctx context.Context, session string, c Chunk) error
	// LastRecordingChunk is the last chunk the store holds of session
	// (NotFound when it holds none).
	LastRecordingChunk(ctx context.Context, session string) (*ChunkRef, error)
}

const (
	// DefaultRetryInterval is how often the uploader rescans the spool,
	// and the first wait before a session whose upload failed is tried
	// again.
	DefaultRetryInterval = 5 * time.Second
	// DefaultMaxRetryInterval caps a failing session's backoff, and is
	// how often a session auth refuses (held) is tried again: a refusal
	// can end without anything on the node changing (the node's auth
	// client moves back to the auth server whose store has the missing
	// chunks).
	DefaultMaxRetryInterval = 5 * time.Minute
	// DefaultUploadConcurrency is how many sessions upload at once.
	DefaultUploadConcurrency = 4
)

// UploaderConfig configures an Uploader.
type UploaderConfig struct {
	// Spool is the node's DATA_DIR/recordings. Required.
	Spool DirStorage
	// Upload sends chunks to auth. Required.
	Upload ChunkUploader
	// Deps: Clock drives rescans and backoff; Metrics gets the upload
	// counters.
	observe.Deps
	// RetryInterval: zero means DefaultRetryInterval.
	RetryInterval time.Duration
	// MaxRetryInterval: zero means DefaultMaxRetryInterval.
	MaxRetryInterval time.Duration
	// Concurrency is how many sessions upload at once; zero means
	// DefaultUploadConcurrency.
	Concurrency int
}

// Refusal reasons (the reason label of postern_recording_upload_refusals_total).
const (
	// RefusedGap: the store lacks chunks that the spool no longer has
	// (they were acknowledged by an auth server whose store this one
	// does not share).
	RefusedGap = "gap"
	// RefusedConflict: the store holds other chunks under this session's
	// indexes.
	RefusedConflict = "conflict"
	// RefusedChunk: auth refuses a chunk that follows what the store
	// holds (not this node's session, a broken chain, bad data).
	RefusedChunk = "refused"
)

// Uploader ships closed chunks from the spool to auth, in order within a
// session, deleting them once auth has them. It starts with whatever the
// spool holds, so chunks left by a crash or restart are shipped first.
//
// Sessions are independent. Each has its own place in the store (asked
// of auth on its first pass: LastRecordingChunk, so that chunks the
// store already has are skipped), its own backoff after a failure, and
// its own state when auth refuses it; a fixed number of workers take
// them from a queue in turn. One session that cannot be shipped once
// held every later one behind it, for good.
//
// A refused session is held, never dropped: its chunks stay in the
// spool (nothing unstored is ever deleted), the refusal is logged once
// and counted, and it is tried again every MaxRetryInterval without
// delaying anything else.
type Uploader struct {
	cfg     UploaderConfig
	metrics *uploaderMetrics
	kick    chan struct{}
	ready   chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// mu guards sessions, queue and the fields of sessionState marked so.
	mu       sync.Mutex
	sessions map[string]*sessionState
	queue    []*sessionState
}

// sessionState is what the uploader knows of one spooled session.
type sessionState struct {
	name string
	// run serialises passes over the session (a worker's, Flush's) and
	// guards what follows up to the Uploader.mu fields.
	run sync.Mutex
	// cur: how far the session's segments are read.
	cur *segmentReader
	// next is the next chunk to ship; every chunk below it is stored.
	next int
	// resumed: next was set from the store (LastRecordingChunk).
	resumed bool

	// Guarded by Uploader.mu.
	queued, running, again bool
	retryAt                time.Time
	backoff                backoff.Backoff
	failing                bool   // the last pass failed (logged)
	held                   string // the refusal reason; "" when not held
}

// NewUploader starts the upload loop; Close stops it.
func NewUploader(cfg UploaderConfig) (*Uploader, error) {
	if cfg.Spool.Dir == "" {
		return nil, trace.BadParameter("recording uploader: missing Spool")
	}
	if cfg.Upload == nil {
		return nil, trace.BadParameter("recording uploader: missing Upload")
	}
	cfg.Deps.SetDefaults(observe.ComponentUploader)
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.MaxRetryInterval <= 0 {
		cfg.MaxRetryInterval = DefaultMaxRetryInterval
	}
	if cfg.MaxRetryInterval < cfg.RetryInterval {
		cfg.MaxRetryInterval = cfg.RetryInterval
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultUploadConcurrency
	}
	m, err := newUploaderMetrics(cfg.Metrics)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := os.MkdirAll(cfg.Spool.Dir, 0o700); err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	u := &Uploader{cfg: cfg, metrics: m, kick: make(chan struct{}, 1), ready: make(chan struct{}, 1),
		sessions: map[string]*sessionState{}}
	// The uploader owns its uploads (Close ends them): no caller's context.
	u.ctx, u.cancel = context.WithCancel(context.Background())
	u.wg.Add(1 + cfg.Concurrency)
	go u.run()
	for i := 0; i < cfg.Concurrency; i++ {
		go u.work()
	}
	return u, nil
}

// Notify asks for a scan (a chunk was closed).
func (u *Uploader) Notify() {
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// Close stops the loop and its workers and waits for them; unshipped
// chunks stay spooled.
func (u *Uploader) Close() error {
	u.cancel()
	u.wg.Wait()
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, s := range u.sessions {
		if s.held != "" {
			u.metrics.held.Dec()
		}
	}
	u.sessions = map[string]*sessionState{}
	return nil
}

// run queues the spool's sessions that are due, at start, on each
// Notify and every RetryInterval.
func (u *Uploader) run() {
	defer u.wg.Done()
	ticker := u.cfg.Clock.NewTicker(u.cfg.RetryInterval)
	defer ticker.Stop()
	for {
		if err := u.dispatch(); err != nil && u.ctx.Err() == nil {
			u.cfg.Logger.WithError(err).Warn("Reading the recording spool failed; will retry.")
		}
		select {
		case <-u.ctx.Done():
			return
		case <-u.kick:
		case <-ticker.Chan():
		}
	}
}

// sessionNames lists the spool's session directories.
func (u *Uploader) sessionNames() ([]string, error) {
	ents, err := os.ReadDir(u.cfg.Spool.Dir)
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && CheckSessionID(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// state returns session's state, made on first sight; u.mu held.
func (u *Uploader) state(session string) *sessionState {
	s := u.sessions[session]
	if s == nil {
		s = &sessionState{name: session, backoff: backoff.Backoff{Min: u.cfg.RetryInterval, Max: u.cfg.MaxRetryInterval, Jitter: true}}
		u.sessions[session] = s
	}
	return s
}

// dispatch queues every due session that is not queued already. One
// that is being shipped is queued again when its pass ends (again), so
// that a chunk closed meanwhile is not left until the next tick.
func (u *Uploader) dispatch() error {
	names, err := u.sessionNames()
	if err != nil {
		return trace.Wrap(err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	now := u.cfg.Clock.Now()
	for _, name := range names {
		s := u.state(name)
		switch {
		case s.queued:
		case now.Before(s.retryAt):
		case s.running:
			s.again = true
		default:
			s.queued = true
			u.queue = append(u.queue, s)
		}
	}
	if len(u.queue) > 0 {
		u.wakeWorker()
	}
	return nil
}

// wakeWorker wakes one idle worker; one that takes a session from a
// queue with more in it wakes the next, so that a burst of sessions
// spreads over the workers.
func (u *Uploader) wakeWorker() {
	select {
	case u.ready <- struct{}{}:
	default:
	}
}

// work ships queued sessions, one pass each, first queued first.
func (u *Uploader) work() {
	defer u.wg.Done()
	for {
		select {
		case <-u.ctx.Done():
			return
		case <-u.ready:
		}
		for u.ctx.Err() == nil {
			u.mu.Lock()
			if len(u.queue) == 0 {
				u.mu.Unlock()
				break
			}
			s := u.queue[0]
			u.queue = u.queue[1:]
			if len(u.queue) > 0 {
				u.wakeWorker()
			}
			s.queued, s.running = false, true
			u.mu.Unlock()

			_ = u.pass(u.ctx, s)

			u.mu.Lock()
			s.running = false
			if s.again && !s.queued && !u.cfg.Clock.Now().Before(s.retryAt) {
				s.queued = true
				u.queue = append(u.queue, s)
			}
			s.again = false
			u.mu.Unlock()
		}
	}
}

// Flush makes one pass over every spooled session now, whatever its
// backoff (a clean shutdown's last pass; tests), and returns what
// failed: one session's failure does not stop the others'.
func (u *Uploader) Flush(ctx context.Context) error {
	names, err := u.sessionNames()
	if err != nil {
		return trace.Wrap(err)
	}
	var errs []error
	for _, name := range names {
		if ctx.Err() != nil {
			return trace.Wrap(ctx.Err())
		}
		u.mu.Lock()
		s := u.state(name)
		u.mu.Unlock()
		if err := u.pass(ctx, s); err != nil {
			errs = append(errs, err)
		}
	}
	return trace.NewAggregate(errs...)
}

// maxResumes bounds the resumes (LastRecordingChunk, then on from what
// the store holds) within one pass: each one moves the session on or
// holds it, so more means the store changes under us; the next pass
// tries again.
const maxResumes = 3

// pass ships what session has spooled and records how it went.
func (u *Uploader) pass(ctx context.Context, s *sessionState) error {
	s.run.Lock()
	defer s.run.Unlock()
	var err error
	for i := 0; i < maxResumes; i++ {
		if err = u.flushSession(ctx, s); !errors.Is(err, errRewind) {
			break
		}
	}
	if errors.Is(err, errRewind) {
		err = trace.CompareFailed("recording %s: the store changed while the upload resumed", s.name)
	}
	u.settle(ctx, s, err)
	return trace.Wrap(err)
}

// settle records the outcome of a pass: the session's backoff, whether
// it is held, and the one log line and count per change.
func (u *Uploader) settle(ctx context.Context, s *sessionState, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	log := u.cfg.Logger.WithField("session_id", s.name)
	var held *heldError
	switch {
	case err == nil:
		if s.held != "" {
			u.metrics.held.Dec()
			log.Info("Auth accepts the held recording again; its upload resumed.")
		} else if s.failing {
			log.Info("Recording upload recovered.")
		}
		s.held, s.failing = "", false
		s.backoff.Reset()
		s.retryAt = time.Time{}
	case ctx.Err() != nil:
		// Closing (or Flush's caller gave up): not the session's fault.
	case errors.As(err, &held):
		if s.held == "" {
			u.metrics.held.Inc()
		}
		if s.held != held.reason {
			u.metrics.refusals.WithLabelValues(held.reason).Inc()
			log.WithError(held.err).Errorf("Auth refuses this recording (%s); its chunks stay in the spool and are offered again every %v.", held.reason, u.cfg.MaxRetryInterval)
		}
		s.held, s.failing = held.reason, false
		s.retryAt = u.cfg.Clock.Now().Add(u.cfg.MaxRetryInterval)
	default:
		if s.held != "" {
			// A held session whose retry failed for want of auth stays
			// held (and counted) until auth takes it.
			s.retryAt = u.cfg.Clock.Now().Add(u.cfg.MaxRetryInterval)
			return
		}
		wait := s.backoff.Next()
		if !s.failing {
			log.WithError(err).Warnf("Uploading the recording failed; retrying it in %v (other sessions go on).", wait)
		} else {
			log.WithError(err).Debugf("Uploading the recording failed again; retrying it in %v.", wait)
		}
		s.failing = true
		s.retryAt = u.cfg.Clock.Now().Add(wait)
	}
}

// forget drops a session that left the spool; u.mu not held.
func (u *Uploader) forget(s *sessionState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sessions[s.name] != s {
		return
	}
	if s.held != "" {
		u.metrics.held.Dec()
		s.held = ""
	}
	delete(u.sessions, s.name)
}

// heldError is a refusal that waiting will not cure.
type heldError struct {
	reason string
	err    error
}

func (e *heldError) Error() string { return fmt.Sprintf("%s: %v", e.reason, e.err) }
func (e *heldError) Unwrap() error { return e.err }

func hold(reason string, err error) error {
	return trace.Wrap(&heldError{reason: reason, err: err})
}

// errRewind asks for another pass at once: the session's place moved
// back to a chunk the spool still has.
var errRewind = errors.New("rewind")

// errStoredFinal: the store holds the session's final chunk, and with
// it everything the spool has.
var errStoredFinal = errors.New("the store holds the final chunk")

// isRefusal tells a refusal of the chunk (auth answered, and no
// retrying changes the answer) from a failure to reach auth or store it.
func isRefusal(err error) bool {
	return trace.IsBadParameter(err) || trace.IsAlreadyExists(err) || trace.IsAccessDenied(err) ||
		trace.IsNotFound(err) || trace.IsCompareFailed(err)
}

type uploaderMetrics struct {
	refusals *prometheus.CounterVec
	held     prometheus.Gauge
}

func newUploaderMetrics(reg prometheus.Registerer) (*uploaderMetrics, error) {
	refusals, err := promreg.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "postern", Subsystem: "recording", Name: "upload_refusals_total",
		Help: "Spooled recordings auth refused for good, by reason (gap, conflict, refused); each is kept in the spool.",
	}, []string{"reason"}))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	held, err := promreg.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "postern", Subsystem: "recording", Name: "uploads_held",
		Help: "Spooled recordings auth refuses now, kept in the spool and offered again every few minutes.",
	}))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &uploaderMetrics{refusals: refusals, held: held}, nil
}
