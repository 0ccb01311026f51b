package client

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// TestJoinEscapeReader: Ctrl-] t ends the session, Ctrl-] Ctrl-] sends
// one, Ctrl-] before anything else sends both, Ctrl-] . leaves and ends
// the input; ~ is typed as is. Byte by byte too: the escape and what
// follows may come in separate reads.
func TestJoinEscapeReader(t *testing.T) {
	for name, wrap := range map[string]func(io.Reader) io.Reader{
		"whole":   func(r io.Reader) io.Reader { return r },
		"onebyte": iotest.OneByteReader,
	} {
		t.Run(name, func(t *testing.T) {
			ends, leaves := 0, 0
			in := "ls\r~.\x1dt\x1d\x1dx\x1dq\x1d.after"
			r := &joinEscapeReader{r: wrap(strings.NewReader(in)), onEnd: func() { ends++ }, onLeave: func() { leaves++ }}
			out, err := io.ReadAll(r)
			require.NoError(t, err)
			require.Equal(t, "ls\r~.\x1dx\x1dq", string(out))
			require.Equal(t, 1, ends)
			require.Equal(t, 1, leaves)
		})
	}
}
