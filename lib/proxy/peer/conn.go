package peer

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// streamConn is one peered dial as a net.Conn with half-close: yamux's
// Close sends FIN and leaves the stream readable, which is CloseWrite here;
// Close also stops our reads (a read deadline in the past), and yamux
// resets the stream after StreamCloseTimeout if the far end never closes
// its side.
type streamConn struct {
	*yamux.Stream
	closeOnce sync.Once
	// onClose, when set, runs once on Close (the client's stream count).
	onClose func()
}

var _ net.Conn = (*streamConn)(nil)

func newStreamConn(st *yamux.Stream) *streamConn { return &streamConn{Stream: st} }

// CloseWrite half-closes: the far end reads EOF, we may still read.
func (c *streamConn) CloseWrite() error { return c.Stream.Close() }

// Close ends the stream for both directions.
func (c *streamConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		err = c.Stream.Close()
		_ = c.Stream.SetReadDeadline(time.Unix(1, 0))
		if c.onClose != nil {
			c.onClose()
		}
	})
	return err
}

// yamux frame header (its spec.md): version, type, flags (2), stream ID
// (4), length (4). A data frame (type 0) with a non-zero length is
// followed by that many bytes of body.
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
)

// coalescingConn is the TLS connection as yamux sees it. yamux's send
// loop writes a data frame's 12-byte header and its body in two calls;
// over TLS that is two records and two syscalls per frame, the header's
// record costing as much as the body's framing. A data header announcing
// a body is held back and sent together with that body, in one write;
// every other frame (window updates, pings, FIN/RST, go-away) goes out at
// once, so nothing is ever delayed waiting for a write that won't come.
// Only yamux's send loop writes (one goroutine), so no lock is needed.
type coalescingConn struct {
	net.Conn
	hdr [yamuxHeaderSize]byte
	// held says hdr holds a data header whose body is the next Write.
	held bool
	buf  []byte
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	if c.held {
		c.held = false
		c.buf = append(append(c.buf[:0], c.hdr[:]...), p...)
		n, err := c.Conn.Write(c.buf)
		if n >= yamuxHeaderSize {
			n -= yamuxHeaderSize
		} else {
			n = 0
		}
		return n, err
	}
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0 {
		copy(c.hdr[:], p)
		c.held = true
		return len(p), nil
	}
	return c.Conn.Write(p)
}
