package party

import (
	"io"
	"sync"
)

// GateState is whether a session's input reaches its program.
type GateState int

const (
	// Open: input goes through.
	Open GateState = iota
	// Held: the session waits for its moderators and its program has not
	// started; input is discarded.
	Held
	// Paused: the moderators left a session whose policy pauses it;
	// input is discarded until one is back.
	Paused
)

func (g GateState) String() string {
	switch g {
	case Held:
		return "held"
	case Paused:
		return "paused"
	default:
		return "open"
	}
}

// Gate is the single way into a session's program: the owner's input and
// every peer's pass it, so that the moderation rules decide in one place
// whether typing reaches the program. A closed gate discards input rather
// than queueing it: keystrokes typed while nobody watched must not run
// the moment a moderator comes back.
type Gate struct {
	dst io.Writer
	// wmu serializes writes to dst, so that two parties' keystrokes are
	// never interleaved inside one write.
	wmu sync.Mutex
	// mu guards state and opened.
	mu    sync.Mutex
	state GateState
	// opened is closed when the gate opens, replaced when it closes.
	opened chan struct{}
}

// NewGate returns a gate to dst in state st.
func NewGate(dst io.Writer, st GateState) *Gate {
	g := &Gate{dst: dst, state: st, opened: make(chan struct{})}
	if st == Open {
		close(g.opened)
	}
	return g
}

// Set changes the gate's state.
func (g *Gate) Set(st GateState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st == g.state {
		return
	}
	wasOpen := g.state == Open
	g.state = st
	switch {
	case st == Open:
		close(g.opened)
	case wasOpen:
		g.opened = make(chan struct{})
	}
}

// State is the gate's state.
func (g *Gate) State() GateState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state
}

// Opened is closed when the gate is open (a channel from the state at
// the call: callers waiting for the program to start select on it).
func (g *Gate) Opened() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opened
}

// Write passes p on when the gate is open and discards it otherwise;
// it fails only when dst does.
func (g *Gate) Write(p []byte) (int, error) {
	if g.State() != Open {
		return len(p), nil
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	return g.dst.Write(p)
}

// SetDst replaces where open input goes: the program's terminal, once a
// held session's program started.
func (g *Gate) SetDst(w io.Writer) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	g.dst = w
}
