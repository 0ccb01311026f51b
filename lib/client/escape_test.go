package client

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// TestEscapeReader: OpenSSH's escape rules. ~ is special only at the start
// of the input or right after a newline (CR, as a raw terminal sends it,
// or LF); ~. disconnects, ~~ sends one ~, ~ and anything else sends both;
// a ~ within a line is typed as is. Read one byte at a time too, so the
// held ~ crosses reads.
func TestEscapeReader(t *testing.T) {
	for _, tc := range []struct {
		in, out      string
		disconnected bool
	}{
		{in: "echo a~.b\r", out: "echo a~.b\r"},
		{in: "~.", out: "", disconnected: true},
		{in: "ls\r~.rest", out: "ls\r", disconnected: true},
		{in: "ls\n~.", out: "ls\n", disconnected: true},
		{in: "\r~~x", out: "\r~x"},
		{in: "\r~~.", out: "\r~."},
		{in: "\r~x~.", out: "\r~x~."},
		{in: "a\r~", out: "a\r"},
	} {
		for _, oneByte := range []bool{false, true} {
			var src io.Reader = bytes.NewReader([]byte(tc.in))
			if oneByte {
				src = iotest.OneByteReader(src)
			}
			disconnects := 0
			r := newEscapeReader(src, '~', func() { disconnects++ })
			var got bytes.Buffer
			buf := make([]byte, 1)
			var err error
			for {
				var n int
				n, err = r.Read(buf)
				got.Write(buf[:n])
				if err != nil {
					break
				}
			}
			require.Equal(t, tc.out, got.String(), "%q one byte: %v", tc.in, oneByte)
			if tc.disconnected {
				require.True(t, errors.Is(err, errEscapeDisconnect), "%q: %v", tc.in, err)
				require.Equal(t, 1, disconnects, tc.in)
			} else {
				require.ErrorIs(t, err, io.EOF, tc.in)
				require.Zero(t, disconnects, tc.in)
			}
		}
	}
}
