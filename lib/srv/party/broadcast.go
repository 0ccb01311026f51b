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

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/termscreen"
)

// DefaultQueueBytes bounds the output queued for one subscriber. A
// party this far behind is not watching live any more: its queue is
// dropped and it is caught up with the current screen instead.
const DefaultQueueBytes = 256 << 10

// DefaultRingBytes is the output kept to rebuild the screen for a party
// that joins or lags: a screenful of a full-screen program is a few KiB,
// so a quarter MiB rebuilds any screen that was drawn recently, at a
// cost paid by the joiner (the emulator runs in its reader), never by the
// session's output path.
const DefaultRingBytes = 256 << 10

// LaggedNotice is what a subscriber reads before its catch-up screen
// when it fell behind and its queued output was dropped.
const LaggedNotice = "\r\n[postern: you fell behind; output skipped to the current screen]\r\n"

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
}

// Broadcaster fans a session's output out: first to Primary, then,
// without ever blocking, to each subscriber's bounded queue.
type Broadcaster struct {
	cfg Config
	// primary is cfg.Primary, replaceable (SetPrimary) while a held
	// session waits for its program.
	primary atomic.Pointer[io.Writer]
	// mu guards the fields below; held only for memory copies, never
	// while writing to the network or running the emulator.
	mu         sync.Mutex
	ring       termscreen.ReplayBuffer
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
	if cfg.Cols <= 0 || cfg.Rows <= 0 {
		cfg.Cols, cfg.Rows = 80, 24
	}
	b := &Broadcaster{
		cfg: cfg, ring: termscreen.ReplayBuffer{Limit: cfg.RingBytes},
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
	for s := range b.subs {
		s.push(p)
	}
}

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
	s.catchUpLocked(false)
	b.subs[s] = struct{}{}
	return s, nil
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
	mu    sync.Mutex
	queue []byte
	// snap is the output to rebuild the screen from, with its size,
	// waiting for the reader to run it through the emulator; lagged says
	// the notice goes first.
	snap       []byte
	snapCols   int
	snapRows   int
	pending    bool
	lagged     bool
	ended      bool
	laggedSeen int
}

// catchUpLocked replaces what is queued by a catch-up from the ring.
// Called with b.mu held.
func (s *Subscriber) catchUpLocked(lagged bool) {
	snap, _ := s.b.ring.Since(s.b.ring.End() - min(s.b.ring.End(), uint64(s.b.cfg.RingBytes)))
	s.mu.Lock()
	s.snap = append(s.snap[:0], snap...)
	s.snapCols, s.snapRows = s.b.cols, s.b.rows
	s.pending, s.lagged = true, lagged
	if lagged {
		s.laggedSeen++
	}
	s.queue = s.queue[:0]
	s.mu.Unlock()
	s.signal()
}

// push queues p, or, when the queue would outgrow its bound, drops the
// queue and schedules a catch-up. Called with b.mu held; never blocks.
func (s *Subscriber) push(p []byte) {
	s.mu.Lock()
	over := len(s.queue)+len(p) > s.limit
	if !over {
		s.queue = append(s.queue, p...)
	}
	s.mu.Unlock()
	if over {
		s.catchUpLocked(true)
		return
	}
	s.signal()
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

// Lags is how many times the subscriber fell behind and was caught up.
func (s *Subscriber) Lags() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.laggedSeen
}

// Next waits for output and returns all of it: a catch-up screen first
// when one is due, then what is queued. It returns io.EOF once the
// subscription ended and nothing is left, ctx's error when ctx ends.
func (s *Subscriber) Next(ctx context.Context) ([]byte, error) {
	for {
		s.mu.Lock()
		var out []byte
		if s.pending {
			snap, cols, rows, lagged := s.snap, s.snapCols, s.snapRows, s.lagged
			s.snap, s.pending = nil, false
			queued := append([]byte(nil), s.queue...)
			s.queue = s.queue[:0]
			s.mu.Unlock()
			if lagged {
				out = append(out, LaggedNotice...)
			}
			out = append(out, repaint(snap, cols, rows)...)
			return append(out, queued...), nil
		}
		if len(s.queue) > 0 {
			out = append(out, s.queue...)
			s.queue = s.queue[:0]
			s.mu.Unlock()
			return out, nil
		}
		ended := s.ended
		s.mu.Unlock()
		if ended {
			return nil, io.EOF
		}
		select {
		case <-s.wake:
		case <-s.done:
		case <-ctx.Done():
			return nil, trace.Wrap(ctx.Err())
		}
	}
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
