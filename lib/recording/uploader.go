package recording

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backoff"
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
	// Clock drives rescans and backoff; nil means the real clock.
	Clock clockwork.Clock
	// RetryInterval: zero means DefaultRetryInterval.
	RetryInterval time.Duration
	// MaxRetryInterval: zero means DefaultMaxRetryInterval.
	MaxRetryInterval time.Duration
	// Concurrency is how many sessions upload at once; zero means
	// DefaultUploadConcurrency.
	Concurrency int
	// Logger: nil means component=recording:upload.
	Logger logrus.FieldLogger
	// Metrics registry; nil means a private one.
	Metrics prometheus.Registerer
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
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
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
	if cfg.Logger == nil {
		cfg.Logger = logrus.WithField("component", "recording:upload")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
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

// flushSession ships a session's chunks in order from s.next on: chunk
// files (an older node's spool) are deleted one by one once auth has
// them; segments are read on from where the last pass stopped and
// deleted once auth has all of them and the writer has moved on to a
// later segment (or the final chunk is shipped, which removes the
// session). A session whose writer is gone (spool.go, lockName) is
// removed once all of it is shipped.
func (u *Uploader) flushSession(ctx context.Context, s *sessionState) error {
	session := s.name
	// Whether the writer is gone is asked before the files are listed:
	// a writer that appends its final chunk and releases its lock while
	// this pass ships the earlier ones has left a chunk this pass never
	// read, and asked afterwards "gone" would remove it unshipped. Gone
	// before the listing, everything it wrote is in the files listed.
	lock, gone := u.cfg.Spool.writerGone(session)
	if gone {
		defer lock.Close()
	}
	chunks, segs, err := u.cfg.Spool.sessionFiles(session)
	if trace.IsNotFound(err) {
		u.forget(s)
		return nil
	}
	if err != nil {
		return trace.Wrap(err)
	}
	done := func() {
		// Nothing follows a final chunk: the session is done here.
		_ = os.RemoveAll(filepath.Join(u.cfg.Spool.Dir, session))
		u.forget(s)
	}
	if !s.resumed {
		// The first pass of this run: start from what the store holds
		// (an earlier run, or another auth server sharing the store,
		// may have stored more than this node knows).
		if err := u.resume(ctx, s, -1, nil); err != nil {
			if errors.Is(err, errStoredFinal) {
				done()
				return nil
			}
			return trace.Wrap(err)
		}
	}
	// ship puts c, or learns from the store that it need not.
	ship := func(c Chunk) error {
		err := u.cfg.Upload.PutRecordingChunk(ctx, session, c)
		if err == nil {
			s.next = c.Index + 1
			return nil
		}
		if !isRefusal(err) || ctx.Err() != nil {
			return trace.Wrap(err, "uploading chunk %d of %s", c.Index, session)
		}
		return trace.Wrap(u.resume(ctx, s, c.Index, err))
	}

	for _, i := range chunks {
		if i >= s.next {
			c, err := u.cfg.Spool.GetChunk(ctx, session, i)
			if err != nil {
				return trace.Wrap(err)
			}
			if err := ship(*c); errors.Is(err, errStoredFinal) {
				done()
				return nil
			} else if err != nil {
				return trace.Wrap(err)
			}
			if c.Final {
				done()
				return nil
			}
		}
		// Stored (shipped now or before, or the store had it).
		if err := u.cfg.Spool.RemoveChunk(session, i); err != nil {
			return trace.Wrap(err)
		}
	}
	for k, first := range segs {
		if k < len(segs)-1 && segs[k+1] <= s.next {
			// All of it is stored (the writer has moved on); its removal
			// failed last time, or the store had it.
			_ = os.Remove(filepath.Join(u.cfg.Spool.Dir, session, segmentName(first)))
			continue
		}
		if s.cur == nil || s.cur.first != first {
			s.cur = &segmentReader{first: first}
		}
		cur := s.cur
		data, err := u.cfg.Spool.readSegmentFrom(session, first, cur.off)
		if err != nil {
			return trace.Wrap(err)
		}
		final := false
		n, err := wholeLines(data, func(line []byte) error {
			if i, ok := recordIndex(line); ok && i < s.next {
				cur.off += int64(len(line)) + 1
				return nil
			}
			var c Chunk
			if err := json.Unmarshal(line, &c); err != nil {
				return hold(RefusedChunk, trace.BadParameter("spooled segment %s of %s is unreadable at byte %d: %v", segmentName(first), session, cur.off, err))
			}
			if c.Index < s.next {
				cur.off += int64(len(line)) + 1
				return nil
			}
			if err := ship(c); err != nil {
				return trace.Wrap(err)
			}
			cur.off += int64(len(line)) + 1
			final = final || c.Final
			return nil
		})
		if errors.Is(err, errStoredFinal) {
			done()
			return nil
		}
		if err != nil {
			return trace.Wrap(err)
		}
		if final {
			done()
			return nil
		}
		if k < len(segs)-1 {
			// The writer has moved on: nothing more comes to this one
			// (a torn tail can only be the last segment's).
			if n < len(data) {
				u.cfg.Logger.WithField("session_id", session).Warnf("Spooled segment %s ends in a torn chunk; skipped.", segmentName(first))
			}
			if err := os.Remove(filepath.Join(u.cfg.Spool.Dir, session, segmentName(first))); err != nil {
				return trace.ConvertSystemError(err)
			}
		}
	}
	if gone {
		// A dead writer's session (a killed node's, found after its
		// restart): all it spooled is shipped, and nothing more will come
		// (the recording stays incomplete).
		done()
	}
	return nil
}

// resume asks auth what the store holds of s and moves s.next there.
// refused is the chunk auth just refused (with why), or -1 on a
// session's first pass. It returns nil to go on from s.next (chunks
// below it are skipped as stored), errRewind to start the pass again
// from a chunk the spool still has, errStoredFinal when the store holds
// the whole recording, or a heldError when the session cannot go on:
//
//   - the store holds chunks below the refused one that the spool no
//     longer has (RefusedGap): they were acknowledged by an auth server
//     whose store this one does not share. The store's recording stays
//     what it is (chunks 0 to s.next-1, no final chunk: read as
//     incomplete, Verify's Complete false, an export ends with
//     IncompleteMarker), and the rest stays in the spool. Shipping it
//     past the gap would make every reader call the recording tampered
//     (a missing chunk) and would need auth to take chunks it cannot
//     chain to the stored ones; offered again every MaxRetryInterval,
//     it completes if the node's client returns to the auth server whose
//     store has the missing chunks;
//   - the store's chunk differs from the spool's of the same index
//     (RefusedConflict);
//   - auth refuses the very chunk that follows what the store holds
//     (RefusedChunk: not this node's session, a broken chain, bad data).
func (u *Uploader) resume(ctx context.Context, s *sessionState, refused int, why error) error {
	session := s.name
	ref, err := u.cfg.Upload.LastRecordingChunk(ctx, session)
	next := 0
	switch {
	case trace.IsNotFound(err):
		ref = nil
	case err != nil:
		if why != nil {
			return trace.Wrap(err, "chunk %d of %s was refused (%v); asking what the store holds", refused, session, why)
		}
		return trace.Wrap(err, "asking what the store holds of %s", session)
	default:
		next = ref.Index + 1
	}
	have, err := u.cfg.Spool.ChunkIndexes(ctx, session)
	if err != nil && !trace.IsNotFound(err) {
		return trace.Wrap(err)
	}
	spooled := func(i int) bool {
		k := sort.SearchInts(have, i)
		return k < len(have) && have[k] == i
	}
	if ref != nil && (spooled(ref.Index) || (len(have) > 0 && ref.Index >= have[0])) {
		// The chain hash names everything up to it: equal, the store
		// holds the spool's chunks 0..ref.Index, and those may be
		// skipped and deleted. A stored chunk the spool should have and
		// has not (the store is ahead of the spool) proves nothing.
		c, err := u.cfg.Spool.GetChunk(ctx, session, ref.Index)
		if err != nil && !trace.IsNotFound(err) {
			return trace.Wrap(err)
		}
		if err != nil || c.Hash != ref.Hash {
			return hold(RefusedConflict, trace.AlreadyExists("the store's chunk %d of %s is not the spooled one", ref.Index, session))
		}
	}
	if ref != nil && ref.Final {
		if len(have) > 0 && have[len(have)-1] > ref.Index {
			return hold(RefusedConflict, trace.AlreadyExists("the store holds %s complete at chunk %d; the spool has chunks after it", session, ref.Index))
		}
		return errStoredFinal
	}
	s.resumed = true
	switch {
	case refused < 0:
		// The first pass: skip what the store has. When the spool begins
		// after the store ends, shipping finds whether auth takes it.
		s.next = max(s.next, next)
		return nil
	case next == refused:
		// The store is where the chunk belongs, yet auth refuses it.
		return hold(RefusedChunk, why)
	case next > refused:
		// The store has it (and the spool's copy, by the hash): skip.
		s.next = max(s.next, next)
		return nil
	case spooled(next):
		// The store lacks chunks that the spool still has: ship them
		// again, from the first one it lacks.
		s.next, s.cur = next, nil
		return errRewind
	default:
		msg := fmt.Sprintf("the store holds chunks 0-%d of %s; the spool starts at chunk %d: the chunks between went to an auth server whose store this one does not share (the stored recording reads as incomplete)", next-1, session, refused)
		if len(have) > 0 {
			msg = fmt.Sprintf("the store holds chunks 0-%d of %s; the spool starts at chunk %d: the chunks between went to an auth server whose store this one does not share (the stored recording reads as incomplete)", next-1, session, have[0])
		}
		if next == 0 {
			msg = fmt.Sprintf("the store holds nothing of %s; the spool does not have its first chunk: the chunks before chunk %d went to an auth server whose store this one does not share", session, refused)
		}
		return hold(RefusedGap, trace.NotFound("%s (chunk %d: %v)", msg, refused, why))
	}
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
