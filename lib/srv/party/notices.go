package party

import (
	"io"
	"sync"
)

// DefaultNoticeBytes bounds the notices queued for an owner who does not
// read: a few hundred join and leave lines. Past it, notices are dropped
// rather than held in memory for a terminal that is not being read.
const DefaultNoticeBytes = 16 << 10

// Notices delivers lines (who joined, who left) to the owner's channel in
// the order they were sent, without the sender ever waiting for it.
//
// The owner's channel has the session's flow control: an owner whose
// client is not reading blocks every write to it. A join announced with
// a plain write there would hold the joiner (its first screen never
// came) and, through the room, everyone after it. Here the sender only
// queues; one goroutine at a time writes the queue out, so the lines keep
// their order, and each lands whole between two of the session's own
// writes (w serializes them).
type Notices struct {
	w     io.Writer
	limit int

	mu      sync.Mutex
	queue   []byte
	running bool
	closed  bool
	// idle is closed when no writer runs (for Wait); replaced when one
	// starts.
	idle chan struct{}
}

// NewNotices returns notices written to w, at most limit bytes queued
// (DefaultNoticeBytes when limit <= 0).
func NewNotices(w io.Writer, limit int) *Notices {
	if limit <= 0 {
		limit = DefaultNoticeBytes
	}
	idle := make(chan struct{})
	close(idle)
	return &Notices{w: w, limit: limit, idle: idle}
}

// Send queues msg and returns at once.
func (n *Notices) Send(msg string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || len(n.queue)+len(msg) > n.limit {
		return
	}
	n.queue = append(n.queue, msg...)
	if n.running {
		return
	}
	n.running = true
	n.idle = make(chan struct{})
	go n.drain(n.idle)
}

// drain writes the queue out until it is empty or the writer fails (the
// channel closed: nothing will be read any more).
func (n *Notices) drain(idle chan struct{}) {
	defer close(idle)
	for {
		n.mu.Lock()
		out := n.queue
		n.queue = nil
		if len(out) == 0 {
			n.running = false
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		if _, err := n.w.Write(out); err != nil {
			n.mu.Lock()
			n.closed, n.queue, n.running = true, nil, false
			n.mu.Unlock()
			return
		}
	}
}

// Close refuses more notices and waits until what is queued is written
// (the last ones, "ended by a moderator", are the reason the session
// ends), the writer fails, or done is closed: a session ends with its
// notices shown, but never hangs on an owner who will not read.
func (n *Notices) Close(done <-chan struct{}) {
	n.mu.Lock()
	n.closed = true
	idle := n.idle
	n.mu.Unlock()
	select {
	case <-idle:
	case <-done:
	}
}
