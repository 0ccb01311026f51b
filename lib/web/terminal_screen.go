package web

import "github.com/postern-dev/postern/lib/termscreen"

// replayBufferSize bounds the output a detached terminal keeps for an
// exact replay (termscreen.ReplayBufferSize).
const replayBufferSize = termscreen.ReplayBufferSize

// history is a terminal's output as lib/termscreen keeps it (the replay
// buffer and the lazily fed emulator); the node catches a joining party
// up with the same code.
type history struct{ h *termscreen.History }

type screenState struct {
	repaint []byte
	text    string
}

func newHistory(cols, rows, limit int) *history {
	return &history{h: termscreen.NewHistory(cols, rows, limit)}
}

func (h *history) end() uint64                             { return h.h.End() }
func (h *history) write(p []byte) uint64                   { return h.h.Write(p) }
func (h *history) resize(cols, rows int)                   { h.h.Resize(cols, rows) }
func (h *history) close()                                  { h.h.Close() }
func (h *history) since(off uint64) ([]byte, uint64, bool) { return h.h.Since(off) }

// screen is termscreen.History.Screen: the current screen and the stream
// offset it stands for.
func (h *history) screen() (screenState, uint64) {
	st, end := h.h.Screen()
	return screenState{repaint: st.Repaint, text: st.Text}, end
}
