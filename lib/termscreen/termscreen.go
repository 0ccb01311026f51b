// Package termscreen keeps a terminal's output so that a client that was
// not watching can be shown the current screen: a byte ring for an exact
// replay, and a server-side VT emulator (charmbracelet/x/vt) that repaints
// the screen from scratch. The web terminal uses it to resume a detached
// terminal; the node uses it to catch a party that joins a live session
// up with the screen the others already see. One implementation for both,
// so a screen restored in the browser and one shown to a joiner agree.
package termscreen

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	uv "github.com/charmbracelet/ultraviolet"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
)

// ReplayBufferSize bounds the output a detached terminal keeps for an
// exact replay. A screenful of a busy full-screen program is a few KiB and
// a minute of a chatty build log well under a MiB; past it the screen is
// restored from the emulator instead, so the bound costs only the
// scrolled-away history, never the screen.
const ReplayBufferSize = 1 << 20

// ReplayBuffer keeps the last ReplayBufferSize bytes of a terminal's
// output stream and where they start. Not safe for concurrent use: its
// owner serializes calls.
type ReplayBuffer struct {
	// Limit is the size kept (ReplayBufferSize on the web terminal).
	Limit int
	data  []byte
	// start is the stream offset of data[0].
	start uint64
}

// End is the offset just past the last byte written.
func (b *ReplayBuffer) End() uint64 { return b.start + uint64(len(b.data)) }

func (b *ReplayBuffer) Write(p []byte) {
	b.data = append(b.data, p...)
	if over := len(b.data) - b.Limit; over > 0 {
		// Copy down rather than reslice, so the array does not grow
		// without bound behind a moving window.
		n := copy(b.data, b.data[over:])
		b.data = b.data[:n]
		b.start += uint64(over)
	}
}

// Since returns the bytes from offset on, or false when they are no
// longer (or not yet) held.
func (b *ReplayBuffer) Since(off uint64) ([]byte, bool) {
	if off < b.start || off > b.End() {
		return nil, false
	}
	return b.data[off-b.start:], true
}

// History is a terminal's output: the replay buffer and, behind it, the
// server-side emulator. The emulator (charmbracelet/x/vt) is slow, a few
// MB/s (it copies every cell on every scroll), so it is fed lazily and off
// the output path: a byte reaches it only when it leaves the replay buffer
// (then nothing else can replay it), or when a repaint needs the current
// screen. Up to ReplayBufferSize of output costs no emulation at all, and
// interactive use never waits for it. A feeder goroutine owns the
// emulator; screenQueue bounds what it may lag behind, past which writes
// wait (a sustained flood of output is paced to the emulator's speed).
type History struct {
	// mu guards buf, fed, resizes and closed.
	mu  sync.Mutex
	buf ReplayBuffer
	// fed is the stream offset up to which the emulator has been given
	// the output.
	fed uint64
	// resizes are window changes at stream offsets the emulator has not
	// reached yet, in order: the screen must be resized between the same
	// bytes as the real one was.
	resizes []pendingResize
	closed  bool
	// ops go to the feeder. Sends happen outside mu, from callers that
	// the terminal's outMu serializes (write, repaint, close), which
	// keeps them in stream order and never after close.
	ops  chan screenOp
	done chan struct{}
}

type pendingResize struct {
	at         uint64
	cols, rows int
}

// screenOp is one step for the feeder: data, a resize, or a request for
// the screen (reply set).
type screenOp struct {
	data       []byte
	cols, rows int
	reply      chan State
}

// State is a screen as the emulator has it.
type State struct {
	// Repaint redraws the screen on a freshly reset terminal.
	Repaint []byte
	// Text is the screen's plain text, one line per row.
	Text string
}

// screenQueue: ops in flight to the feeder; each is at most one write's
// worth (an SSH packet, 32 KiB), so the lag is bounded at a few MiB.
const screenQueue = 128

// NewHistory starts a terminal's history; limit is the replay buffer's
// size (ReplayBufferSize).
func NewHistory(cols, rows, limit int) *History {
	h := &History{buf: ReplayBuffer{Limit: limit}, ops: make(chan screenOp, screenQueue), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		// The emulator is made on first use: vt's parser allocates a
		// 4 MiB buffer up front, and most terminals never print more than
		// the replay buffer or need a repaint.
		var scr *Screen
		get := func() *Screen {
			if scr == nil {
				scr = NewScreen(cols, rows)
			}
			return scr
		}
		defer func() {
			if scr != nil {
				scr.Close()
			}
		}()
		for op := range h.ops {
			switch {
			case op.reply != nil:
				op.reply <- State{Repaint: get().Repaint(), Text: get().Text()}
			case op.data != nil:
				get().Write(op.data)
			case scr == nil:
				cols, rows = op.cols, op.rows
			default:
				scr.Resize(op.cols, op.rows)
			}
		}
	}()
	return h
}

// End is the stream offset past the last byte written.
func (h *History) End() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.buf.End()
}

// Since returns a copy of the output from off on, and the oldest offset
// held; ok is false when off is no longer (or not yet) held.
func (h *History) Since(off uint64) (data []byte, start uint64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.buf.Since(off)
	return append([]byte(nil), d...), h.buf.start, ok
}

// Write appends p and returns its offset; what leaves the replay buffer
// goes to the emulator. Callers serialize write, repaint and close.
func (h *History) Write(p []byte) uint64 {
	h.mu.Lock()
	seq := h.buf.End()
	var evicted []byte
	newStart := h.buf.start
	if newEnd := seq + uint64(len(p)); newEnd > uint64(h.buf.Limit) {
		newStart = max(newStart, newEnd-uint64(h.buf.Limit))
	}
	if n := newStart - min(newStart, h.fed); n > 0 {
		evicted = make([]byte, 0, n)
		if old, ok := h.buf.Since(h.fed); ok {
			evicted = append(evicted, old[:min(uint64(len(old)), n)]...)
		}
		evicted = append(evicted, p[:n-uint64(len(evicted))]...)
	}
	h.buf.Write(p)
	ops := h.takeLocked(evicted)
	closed := h.closed
	h.mu.Unlock()
	if !closed {
		for _, op := range ops {
			h.ops <- op
		}
	}
	return seq
}

// takeLocked turns data (the output from fed on) into feeder ops with
// the pending resizes in their places, and advances fed.
func (h *History) takeLocked(data []byte) []screenOp {
	var ops []screenOp
	end := h.fed + uint64(len(data))
	for len(h.resizes) > 0 && h.resizes[0].at <= end {
		r := h.resizes[0]
		h.resizes = h.resizes[1:]
		if cut := r.at - min(r.at, h.fed); cut > 0 {
			ops = append(ops, screenOp{data: data[:cut]})
			data = data[cut:]
			h.fed += cut
		}
		ops = append(ops, screenOp{cols: r.cols, rows: r.rows})
	}
	if len(data) > 0 {
		ops = append(ops, screenOp{data: data})
	}
	h.fed = end
	return ops
}

// Resize records a window change at the current end of the stream.
func (h *History) Resize(cols, rows int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resizes = append(h.resizes, pendingResize{at: h.buf.End(), cols: cols, rows: rows})
}

// Screen brings the emulator up to the end of the stream and returns its
// screen and the offset it stands for. Callers serialize it with write.
func (h *History) Screen() (State, uint64) {
	h.mu.Lock()
	end := h.buf.End()
	tail, _ := h.buf.Since(h.fed)
	ops := h.takeLocked(append([]byte(nil), tail...))
	// A resize at the very end is applied too.
	for _, r := range h.resizes {
		ops = append(ops, screenOp{cols: r.cols, rows: r.rows})
	}
	h.resizes = nil
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return State{}, end
	}
	reply := make(chan State, 1)
	for _, op := range ops {
		h.ops <- op
	}
	h.ops <- screenOp{reply: reply}
	return <-reply, end
}

// Close stops the feeder and waits for it. Callers serialize it with
// write and screen.
func (h *History) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	h.mu.Unlock()
	close(h.ops)
	<-h.done
}

// Screen is the server-side emulator of one terminal: every output byte
// goes through it (lazily: see history), so a client that missed more
// than the replay buffer gets the current screen repainted. It is
// charmbracelet/x/vt, not a parser of our own. Not safe for concurrent
// use: history's feeder goroutine owns it.
type Screen struct {
	emu *vt.Emulator
	// modes are the DEC private modes the program set, tracked through
	// the emulator's callbacks (it keeps its own set private).
	modes map[ansi.DECMode]bool
	// drained ends when the emulator's reply pipe is closed.
	drained chan struct{}
}

// NewScreen starts an emulator of cols x rows; Close ends it.
func NewScreen(cols, rows int) *Screen {
	s := &Screen{emu: vt.NewEmulator(cols, rows), modes: map[ansi.DECMode]bool{}, drained: make(chan struct{})}
	s.emu.SetCallbacks(vt.Callbacks{
		EnableMode: func(m ansi.Mode) {
			if d, ok := m.(ansi.DECMode); ok {
				s.modes[d] = true
			}
		},
		DisableMode: func(m ansi.Mode) {
			if d, ok := m.(ansi.DECMode); ok {
				delete(s.modes, d)
			}
		},
	})
	// The emulator answers queries (device attributes, cursor position)
	// into a synchronous pipe; unread, the next query would block the
	// output path. The browser answers them when attached, so the
	// emulator's answers are discarded. close ends this goroutine.
	go func() {
		defer close(s.drained)
		_, _ = io.Copy(io.Discard, s.emu)
	}()
	return s
}

func (s *Screen) Write(p []byte) { _, _ = s.emu.Write(p) }

func (s *Screen) Resize(cols, rows int) { s.emu.Resize(cols, rows) }

// Close stops the reply drain and waits for it. It closes the pipe
// directly: Emulator.Close writes a flag the drain goroutine reads.
func (s *Screen) Close() {
	if pw, ok := s.emu.InputPipe().(*io.PipeWriter); ok {
		_ = pw.CloseWithError(io.EOF)
	}
	<-s.drained
}

// modesHandledApart are modes the repaint sets by itself, in order.
var modesHandledApart = map[ansi.DECMode]bool{
	ansi.ModeAltScreenSaveCursor: true, 47: true, 1047: true, ansi.ModeTextCursorEnable: true,
}

// Repaint returns the escape sequences that redraw the current screen on
// a freshly reset terminal: the alternate screen when a full-screen
// program holds it, every row with its styles, the modes the program
// set (cursor keys, bracketed paste, mouse reporting ...), then the
// cursor. What the alternate screen covers of the main screen is not
// kept by the emulator while it is active, and is not redrawn.
func (s *Screen) Repaint() []byte {
	var b strings.Builder
	if s.emu.IsAltScreen() {
		b.WriteString(ansi.SetModeAltScreenSaveCursor)
	}
	b.WriteString("\x1b[H\x1b[2J")
	w, h := s.emu.Width(), s.emu.Height()
	for y := 0; y < h; y++ {
		line := make(uv.Line, w)
		for x := 0; x < w; x++ {
			if c := s.emu.CellAt(x, y); c != nil {
				line[x] = *c
			}
		}
		fmt.Fprintf(&b, "\x1b[%d;1H%s\x1b[0m", y+1, trimBlankTail(line).Render())
	}
	modes := make([]int, 0, len(s.modes))
	for m := range s.modes {
		if !modesHandledApart[m] {
			modes = append(modes, int(m))
		}
	}
	sort.Ints(modes)
	for _, m := range modes {
		fmt.Fprintf(&b, "\x1b[?%dh", m)
	}
	pos := s.emu.CursorPosition()
	fmt.Fprintf(&b, "\x1b[%d;%dH", pos.Y+1, pos.X+1)
	if s.emu.CursorHidden() {
		b.WriteString(ansi.HideCursor)
	} else {
		b.WriteString(ansi.ShowCursor)
	}
	return []byte(b.String())
}

// trimBlankTail drops a row's trailing unstyled blanks. The screen was
// just cleared, so they draw nothing; written out they would be real
// spaces in the browser's terminal, which a copy of a restored line
// carries along and which are not on the screen the shell drew (a line
// the shell writes later over that row keeps them after its end).
// Blanks with a colour or a link are drawn, and kept.
func trimBlankTail(line uv.Line) uv.Line {
	end := len(line)
	for end > 0 && (line[end-1].IsZero() || line[end-1].Equal(&uv.EmptyCell)) {
		end--
	}
	return line[:end]
}

// Text is the screen's plain text, one line per row (tests compare it).
func (s *Screen) Text() string { return s.emu.String() }
