package peer

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

type writesConn struct {
	net.Conn
	writes [][]byte
}

func (w *writesConn) Write(p []byte) (int, error) {
	w.writes = append(w.writes, append([]byte(nil), p...))
	return len(p), nil
}

func header(typ byte, length uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[1] = typ
	binary.BigEndian.PutUint32(h[4:8], 3)
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

// TestCoalescingConn: a data header and its body leave in one write;
// frames without a body (a window update, an empty data frame carrying
// FIN) leave at once, never held behind a write that may not come.
func TestCoalescingConn(t *testing.T) {
	w := &writesConn{}
	c := &coalescingConn{Conn: w}

	n, err := c.Write(header(yamuxTypeData, 5))
	require.NoError(t, err)
	require.Equal(t, yamuxHeaderSize, n)
	require.Empty(t, w.writes, "the header waits for its body")
	n, err = c.Write([]byte("hello"))
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, [][]byte{append(header(yamuxTypeData, 5), "hello"...)}, w.writes)

	w.writes = nil
	_, err = c.Write(header(1, 65536)) // window update
	require.NoError(t, err)
	_, err = c.Write(header(yamuxTypeData, 0)) // FIN without data
	require.NoError(t, err)
	require.Equal(t, [][]byte{header(1, 65536), header(yamuxTypeData, 0)}, w.writes)
}
