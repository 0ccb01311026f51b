package web

import (
	"fmt"
	"io"
	"sort"
	"strings"

	uv "github.com/charmbracelet/ultraviolet"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
)

// replayBufferSize bounds the output a detached terminal keeps for an
// exact replay. A screenful of a busy full-screen program is a few KiB and
// a minute of a chatty build log well under a MiB; past it the screen is
// restored from the emulator instead, so the bound costs only the
// scrolled-away history, never the screen.
const replayBufferSize = 1 << 20

// replayBuffer keeps the last replayBufferSize bytes of a terminal's
// output stream and where they start. Not safe for concurrent use: the
// terminal's mu guards it.
type replayBuffer struct {
	data []byte
	// start is the stream offset of data[0].
	start uint64
}

// end is the offset just past the last byte written.
func (b *replayBuffer) end() uint64 { return b.start + uint64(len(b.data)) }

func (b *replayBuffer) write(p []byte) {
	b.data = append(b.data, p...)
	if over := len(b.data) - replayBufferSize; over > 0 {
		// Copy down rather than reslice, so the array does not grow
		// without bound behind a moving window.
		n := copy(b.data, b.data[over:])
		b.data = b.data[:n]
		b.start += uint64(over)
	}
}

// since returns the bytes from offset on, or false when they are no
// longer (or not yet) held.
func (b *replayBuffer) since(off uint64) ([]byte, bool) {
	if off < b.start || off > b.end() {
		return nil, false
	}
	return b.data[off-b.start:], true
}

// screen is the server-side emulator of one terminal: every output byte
// goes through it, so a client that missed more than the replay buffer
// gets the current screen repainted. It is charmbracelet/x/vt, not a
// parser of our own. Not safe for concurrent use: the terminal's mu
// guards it.
type screen struct {
	emu *vt.Emulator
	// modes are the DEC private modes the program set, tracked through
	// the emulator's callbacks (it keeps its own set private).
	modes map[ansi.DECMode]bool
	// drained ends when the emulator's reply pipe is closed.
	drained chan struct{}
}

func newScreen(cols, rows int) *screen {
	s := &screen{emu: vt.NewEmulator(cols, rows), modes: map[ansi.DECMode]bool{}, drained: make(chan struct{})}
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

func (s *screen) write(p []byte) { _, _ = s.emu.Write(p) }

func (s *screen) resize(cols, rows int) { s.emu.Resize(cols, rows) }

// close stops the reply drain and waits for it. It closes the pipe
// directly: Emulator.Close writes a flag the drain goroutine reads.
func (s *screen) close() {
	if pw, ok := s.emu.InputPipe().(*io.PipeWriter); ok {
		_ = pw.CloseWithError(io.EOF)
	}
	<-s.drained
}

// modesHandledApart are modes the repaint sets by itself, in order.
var modesHandledApart = map[ansi.DECMode]bool{
	ansi.ModeAltScreenSaveCursor: true, 47: true, 1047: true, ansi.ModeTextCursorEnable: true,
}

// repaint returns the escape sequences that redraw the current screen on
// a freshly reset terminal: the alternate screen when a full-screen
// program holds it, every row with its styles, the modes the program
// set (cursor keys, bracketed paste, mouse reporting ...), then the
// cursor. What the alternate screen covers of the main screen is not
// kept by the emulator while it is active, and is not redrawn.
func (s *screen) repaint() []byte {
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
		fmt.Fprintf(&b, "\x1b[%d;1H%s\x1b[0m", y+1, line.Render())
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

// text is the screen's plain text, one line per row (tests compare it).
func (s *screen) text() string { return s.emu.String() }
