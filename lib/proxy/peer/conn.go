package peer

import (
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
