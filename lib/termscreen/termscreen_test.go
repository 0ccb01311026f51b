package termscreen

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHistoryLazyEmulatorMatchesEager: feeding the emulator lazily (only
// what leaves the replay buffer, then the tail at repaint) with resizes
// at their stream offsets gives the same screen as feeding every byte
// as it comes.
func TestHistoryLazyEmulatorMatchesEager(t *testing.T) {
	const limit = 16 << 10
	h := NewHistory(80, 24, limit)
	defer h.Close()
	eager := NewScreen(80, 24)
	defer eager.Close()
	write := func(p []byte) {
		h.Write(p)
		eager.Write(p)
	}
	// 91 columns: wrapped at 80, not at 100, so a resize applied at the
	// wrong offset shows on the screen.
	line := bytes.Repeat([]byte("y"), 85)
	// A single write larger than the whole buffer, too.
	write(bytes.Repeat(append(bytes.Repeat([]byte("z"), 200), '\r', '\n'), 2*limit/200))
	for i := 0; i < 1000; i++ {
		write([]byte(fmt.Sprintf("%05d %s\r\n", i, line)))
		if i == 990 {
			h.Resize(100, 30)
			eager.Resize(100, 30)
		}
	}
	require.Greater(t, h.End(), uint64(4*limit))
	write([]byte("\x1b[?1049h\x1b[?2004h\x1b[H\x1b[2JTOP LINE\x1b[10;20Hmiddle"))
	st, end := h.Screen()
	require.Equal(t, h.End(), end)
	require.Equal(t, string(eager.Repaint()), string(st.Repaint))
	require.True(t, strings.HasPrefix(string(st.Repaint), "\x1b[?1049h"))
	require.Contains(t, string(st.Repaint), "\x1b[?2004h")
	require.Contains(t, st.Text, "TOP LINE")

	// And on: the emulator is at the end; more output keeps it exact.
	write([]byte("\x1b[?1049lback on the main screen\r\n"))
	st, _ = h.Screen()
	require.Equal(t, string(eager.Repaint()), string(st.Repaint))
	require.Contains(t, st.Text, "00999 yyy")
}

// BenchmarkTerminalOutput: the output path's cost per byte with the
// emulator behind it (a flood: every byte leaves the replay buffer).
func BenchmarkTerminalOutput(b *testing.B) {
	h := NewHistory(120, 40, ReplayBufferSize)
	defer h.Close()
	chunk := bytes.Repeat(append(bytes.Repeat([]byte("x"), 100), '\r', '\n'), 300)
	b.SetBytes(int64(len(chunk)))
	for i := 0; i < b.N; i++ {
		h.Write(chunk)
	}
}

// TestRepaintWritesNoTrailingBlanks: a restored row ends where the
// shell's text ends. Rows written out to the full width leave real
// spaces in the browser's terminal: a copied line carries them, and a
// line the shell prints over that row later keeps them after its end.
// A blank with a background colour is drawn, so it stays.
func TestRepaintWritesNoTrailingBlanks(t *testing.T) {
	s := NewScreen(40, 5)
	defer s.Close()
	s.Write([]byte("$ echo hi\r\nhi\r\n\x1b[41m  \x1b[0m\r\n$ "))
	r := string(s.Repaint())
	for _, row := range []string{"\x1b[1;1H$ echo hi\x1b[0m", "\x1b[2;1Hhi\x1b[0m", "\x1b[4;1H$\x1b[0m", "\x1b[5;1H\x1b[0m"} {
		require.Contains(t, r, row)
	}
	require.Regexp(t, `\x1b\[3;1H\x1b\[41m  \x1b\[m`, r, "the coloured blanks are drawn")
	require.True(t, strings.HasSuffix(r, "\x1b[4;3H\x1b[?25h"), "the cursor after the prompt: %q", r)
}
