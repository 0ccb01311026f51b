// Package party is a live session as a room others may join: its output
// is broadcast to every party watching, its input passes a gate that the
// moderation rules open and close, and a registry finds it by session id.
//
// The owner's channel and the recording keep the session's flow control
// (a slow owner slows its own program, as with OpenSSH); every other
// party is a subscriber with a bounded queue, so that no joined party,
// however slow, can hold the session or the others back.
package party

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/termscreen"
)

// DefaultQueueBytes bounds the output queued for one subscriber: several
// full-screen redraws, so that interactive output never lags, while a
// flood (a `cat` of a big file) does. A party this far behind is not
// watching live any more: its queue is dropped, it misses the output of
// DefaultLagPause, then reads the last TailBytes of output and goes on
// from there. Its cost to the node is so bounded (a flood reaches each
// lagging observer at about (DefaultQueueBytes+TailBytes)/DefaultLagPause)
// whatever the session prints, and never on the owner's path.
const DefaultQueueBytes = 32 << 10

// DefaultLagPause is how long a lagging subscriber skips output before
// it is caught up.
const DefaultLagPause = 250 * time.Millisecond

// DefaultFrame is the least time between two reads of a subscriber
// that has output: a person watching needs no more than 50 screens a
// second, and a subscriber that wakes once a frame instead of once a
// write costs a flooding session's CPUs little (output that comes faster
// than a frame's queue holds makes it lag and skip, see
// DefaultQueueBytes).
const DefaultFrame = 20 * time.Millisecond

// TailBytes is the output a lagging subscriber is caught up with: about
// a screenful, which its own terminal redraws.
const TailBytes = 4 << 10

// DefaultRingBytes is the output kept to rebuild the screen for a party
// that joins or lags: a screenful of a full-screen program is a few KiB,
// so a quarter MiB rebuilds any screen that was drawn recently, at a
// cost paid by the joiner (the emulator runs in its reader), never by the
// session's output path.
const DefaultRingBytes = 256 << 10

// LaggedNotice is what a subscriber reads before its catch-up screen
// when it fell behind and its queued output was dropped.
const LaggedNotice = "\r\n[postern: output too fast to follow; skipped ahead]\r\n"

// Config configures a Broadcaster.
type Config struct {
	// Primary receives every byte first and synchronously (the owner's
	// channel, with the recording teed in): its error ends the write, and
	// its pace is the session's. Nil means none.
	Primary io.Writer
	// Cols and Rows are the terminal's size at the start.
	Cols, Rows int
	// QueueBytes bounds each subscriber's queue (DefaultQueueBytes).
	QueueBytes int
	// RingBytes is the output kept for catch-up (DefaultRingBytes).
	RingBytes int
	// LagPause is DefaultLagPause unless set.
	LagPause time.Duration
	// Frame is DefaultFrame unless set; negative: none.
	Frame time.Duration
	// Clock times the lag pauses; nil means the real clock.
	Clock clockwork.Clock
}

// Broadcaster fans a session's output out: first to Primary, then,
// without ever blocking, to each subscriber's bounded queue.
type Broadcaster struct {
	cfg Config
	// primary is cfg.Primary, replaceable (SetPrimary) while a held
	// session waits for its program.
	primary atomic.Pointer[io.Writer]
	// written is the output Primary took, in bytes: how far the session
	// is (Written).
	written atomic.Int64
	// mu guards the fields below; held only for memory copies, never
	// while writing to the network or running the emulator.
	mu         sync.Mutex
	ring       tailRing
	cols, rows int
	subs       map[*Subscriber]struct{}
	closed     bool
}

// NewBroadcaster returns a broadcaster with cfg's defaults filled in.
func NewBroadcaster(cfg Config) *Broadcaster {
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	if cfg.RingBytes <= 0 {
		cfg.RingBytes = DefaultRingBytes
	}
	if cfg.Frame == 0 {
		cfg.Frame = DefaultFrame
	}
	if cfg.LagPause <= 0 {
		cfg.LagPause = DefaultLagPause
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Cols <= 0 || cfg.Rows <= 0 {
		cfg.Cols, cfg.Rows = 80, 24
	}
	b := &Broadcaster{
		cfg: cfg, ring: tailRing{limit: cfg.RingBytes},
		cols: cfg.Cols, rows: cfg.Rows, subs: map[*Subscriber]struct{}{},
	}
	if cfg.Primary != nil {
		b.primary.Store(&cfg.Primary)
	}
	return b
}

// SetPrimary replaces Primary: a session held for its moderators has
// only its owner's channel until its program (and recording) starts.
func (b *Broadcaster) SetPrimary(w io.Writer) { b.primary.Store(&w) }

// Write is the session's output: Primary's write, then what Primary took
// goes to the catch-up ring and every subscriber.
func (b *Broadcaster) Write(p []byte) (int, error) {
	n := len(p)
	var err error
	if w := b.primary.Load(); w != nil && *w != nil {
		n, err = (*w).Write(p)
	}
	if n > 0 {
		b.written.Add(int64(n))
		b.fanOut(p[:n], true)
	}
	return n, err
}

// Notice is a line for every subscriber (who joined, who left), not part
// of the session's output: it is neither in the catch-up ring nor written
// to Primary (the owner's side prints it itself, outside the recording).
func (b *Broadcaster) Notice(msg string) {
	b.fanOut([]byte(msg), false)
}

func (b *Broadcaster) fanOut(p []byte, output bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if output {
		b.ring.Write(p)
	}
	if len(b.subs) == 0 {
		return
	}
	// One copy for all, and only when a party queues it: the
	// subscribers queue the same immutable chunk, so the owner's path
	// pays one copy, not one per party; and none while every party is
	// skipping a flood (the usual state of observers of a `cat`), as
	// the copy (its allocation and its collection) was most of the
	// fan-out's cost there.
	var chunk []byte
	now := b.cfg.Clock.Now()
	for s := range b.subs {
		chunk = s.push(p, chunk, now)
	}
}

// Written is how many bytes of output the session wrote so far: a
// session whose owner stops reading stops there (its flow control).
func (b *Broadcaster) Written() int64 { return b.written.Load() }

// Resize notes the terminal's size for the screens rebuilt from now on.
func (b *Broadcaster) Resize(cols, rows int) {
	if cols <= 0 || rows <= 0 {
		return
	}
	b.mu.Lock()
	b.cols, b.rows = cols, rows
	b.mu.Unlock()
}

// Size is the terminal's size last noted.
func (b *Broadcaster) Size() (cols, rows int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cols, b.rows
}

// Subscribe adds a subscriber. Its first read is the current screen,
// repainted, and from there on the output as it comes: the snapshot is
// taken in the same critical section that registers it, so nothing is
// missed or shown twice.
func (b *Broadcaster) Subscribe() (*Subscriber, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, trace.NotFound("the session has ended")
	}
	s := &Subscriber{b: b, limit: b.cfg.QueueBytes, wake: make(chan struct{}, 1), done: make(chan struct{})}
	// The joiner's first screen: the emulator's, run in its reader.
	s.snap = append([]byte(nil), b.tailLocked(b.cfg.RingBytes)...)
	s.snapCols, s.snapRows, s.first = b.cols, b.rows, true
	s.signal()
	b.subs[s] = struct{}{}
	return s, nil
}

// tailLocked is the last n bytes of output held. Called with b.mu held.
func (b *Broadcaster) tailLocked(n int) []byte {
	return b.ring.tail(n)
}

// Subscribers is how many subscribers there are.
func (b *Broadcaster) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// Close ends the broadcast: every subscriber reads what is queued, then
// io.EOF. Writes after Close go to Primary only.
func (b *Broadcaster) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for s := range b.subs {
		s.endLocked()
	}
	b.subs = nil
}

// Subscriber is one party's view of the output.
type Subscriber struct {
	b     *Broadcaster
	limit int
	// wake has a token when there is something to read.
	wake chan struct{}
	// done is closed when the subscription ends (Close, or the
	// broadcaster's).
	done chan struct{}

	// mu guards the fields below (taken under b.mu by push).
	mu sync.Mutex
	// queue holds shared chunks (never written to), queued bytes in all.
	queue  [][]byte
	queued int
	// first says the first screen is due: rebuilt from snap, the output
	// held at the join, at snapCols x snapRows (the reader runs the
	// emulator).
	first              bool
	snap               []byte
	snapCols, snapRows int
	// skipUntil is set while the subscriber skips output after a lag;
	// the reader then catches up from the ring.
	skipUntil time.Time
	// nextRead is when the reader may take output again (a frame after
	// the last it took).
	nextRead time.Time
	lags     int
	ended    bool
}

// push queues p, or, when the queue would outgrow its bound, drops the
// queue and starts a lag pause. chunk is p's shared copy when an earlier
// subscriber made it, nil otherwise; push returns it (made when it
// queues p). Called with b.mu held; never blocks.
func (s *Subscriber) push(p, chunk []byte, now time.Time) []byte {
	s.mu.Lock()
	switch {
	case !s.skipUntil.IsZero():
		// Skipping: the catch-up will show the tail. The reader is
		// not woken: it waits for the pause's end on its own timer.
		s.mu.Unlock()
		return chunk
	case s.queued+len(p) > s.limit:
		s.queue, s.queued = nil, 0
		s.skipUntil = now.Add(s.b.cfg.LagPause)
		s.lags++
	default:
		if chunk == nil {
			chunk = append([]byte(nil), p...)
		}
		wasEmpty := s.queued == 0
		s.queue = append(s.queue, chunk)
		s.queued += len(chunk)
		if !wasEmpty {
			// The reader was woken by the first chunk already: one
			// wake-up per read, not per write.
			s.mu.Unlock()
			return chunk
		}
	}
	s.mu.Unlock()
	s.signal()
	return chunk
}

func (s *Subscriber) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// endLocked ends the subscription; called with b.mu held.
func (s *Subscriber) endLocked() {
	s.mu.Lock()
	if !s.ended {
		s.ended = true
		close(s.done)
	}
	s.mu.Unlock()
}

// Lags is how many times the subscriber fell behind.
func (s *Subscriber) Lags() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lags
}

// Next waits for output and returns all of it: the first screen first,
// then what is queued; after a lag, once its pause is over, a notice and
// the tail of the output. It returns io.EOF once the subscription ended
// and nothing is left, ctx's error when ctx ends.
func (s *Subscriber) Next(ctx context.Context) ([]byte, error) {
	if err := s.waitFrame(ctx); err != nil {
		return nil, err
	}
	for {
		s.mu.Lock()
		if s.first {
			snap, cols, rows := s.snap, s.snapCols, s.snapRows
			s.snap, s.first = nil, false
			queued := s.takeLocked()
			s.mu.Unlock()
			return append(repaint(snap, cols, rows), queued...), nil
		}
		if s.queued > 0 {
			out := s.takeLocked()
			s.mu.Unlock()
			return out, nil
		}
		skipUntil, ended := s.skipUntil, s.ended
		s.mu.Unlock()
		if ended {
			return nil, io.EOF
		}
		var timer clockwork.Timer
		var fire <-chan time.Time
		if !skipUntil.IsZero() {
			wait := skipUntil.Sub(s.b.cfg.Clock.Now())
			if wait <= 0 {
				if out, ok := s.catchUp(); ok {
					return out, nil
				}
				continue
			}
			timer = s.b.cfg.Clock.NewTimer(wait)
			fire = timer.Chan()
		}
		select {
		case <-s.wake:
		case <-fire:
		case <-s.done:
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil, trace.Wrap(ctx.Err())
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// waitFrame waits until a frame has passed since the last read (or the
// subscription ended).
func (s *Subscriber) waitFrame(ctx context.Context) error {
	if s.b.cfg.Frame <= 0 {
		return nil
	}
	s.mu.Lock()
	next := s.nextRead
	s.mu.Unlock()
	wait := next.Sub(s.b.cfg.Clock.Now())
	if next.IsZero() || wait <= 0 {
		return nil
	}
	timer := s.b.cfg.Clock.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.Chan():
	case <-s.done:
	case <-ctx.Done():
		return trace.Wrap(ctx.Err())
	}
	return nil
}

// catchUp ends a lag pause: the notice and the tail of the output, and
// from then on the output as it comes (both under b.mu, so that they
// join without a gap).
func (s *Subscriber) catchUp() ([]byte, bool) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.skipUntil.IsZero() {
		return nil, false
	}
	s.skipUntil = time.Time{}
	s.queue, s.queued = nil, 0
	out := append([]byte(LaggedNotice), s.b.tailLocked(TailBytes)...)
	return out, true
}

// takeLocked empties the queue into one buffer. Called with s.mu held.
func (s *Subscriber) takeLocked() []byte {
	s.nextRead = s.b.cfg.Clock.Now().Add(s.b.cfg.Frame)
	out := make([]byte, 0, s.queued)
	for _, c := range s.queue {
		out = append(out, c...)
	}
	s.queue, s.queued = nil, 0
	return out
}

// Close ends the subscription; Next returns io.EOF once the queue is read.
func (s *Subscriber) Close() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	delete(s.b.subs, s)
	s.endLocked()
}

// repaint runs out through an emulator of cols x rows and returns the
// screen it leaves, drawn on a reset terminal.
func repaint(out []byte, cols, rows int) []byte {
	scr := termscreen.NewScreen(cols, rows)
	defer scr.Close()
	scr.Write(out)
	return scr.Repaint()
}

// tailRing keeps at least the last limit bytes of the output, compacting
// only when it holds twice that: a copy of limit bytes every limit bytes
// written, not one per write.
type tailRing struct {
	limit int
	data  []byte
}

func (r *tailRing) Write(p []byte) {
	r.data = append(r.data, p...)
	if len(r.data) > 2*r.limit {
		n := copy(r.data, r.data[len(r.data)-r.limit:])
		r.data = r.data[:n]
	}
}

// tail is the last n bytes held (fewer when fewer were written).
func (r *tailRing) tail(n int) []byte {
	return r.data[len(r.data)-min(n, len(r.data), r.limit):]
}
