package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/gravitational/trace"
)

// maxBannerLine is RFC 4253 section 4.2's limit on the identification
// line: 255 characters including the CR LF.
const maxBannerLine = 255

// errNotSSH is the cause recorded when a peer's first line is not an SSH
// identification string.
var errNotSSH = errors.New("the first line is not an SSH-2.0 identification string")

// checkBanner reads what the peer says first and refuses a peer that is
// not an SSH server, before a single client byte is relayed to it.
//
// The proxy only splices bytes, so without this a node record whose addr
// points at the auth API, the web port or any internal service would turn
// the proxy into a relay to it. An SSH server speaks first (RFC 4253
// section 4.2), so waiting for its identification costs no round trip:
// the client would wait for the same bytes anyway. The first line must
// start with "SSH-2.0-" (or "SSH-1.99-", a server that also speaks 2.0).
// RFC 4253 lets a server send other lines before it; Postern nodes and
// OpenSSH do not, and a relay that accepted them would accept an HTTP
// server's error page too.
//
// The returned conn replays the bytes read, so the client still sees the
// whole banner. The wait is real time (it bounds socket I/O, which a fake
// clock cannot speed up) and ends early when ctx does.
func checkBanner(ctx context.Context, conn net.Conn, timeout time.Duration) (net.Conn, error) {
	if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, trace.Wrap(err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, 0, maxBannerLine)
	for !bytes.Contains(buf, []byte("\n")) {
		if len(buf) == cap(buf) {
			return nil, errNotSSH
		}
		n, err := conn.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			if errors.Is(err, io.EOF) {
				return nil, errors.New("the peer closed the connection without an SSH identification string")
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil, errors.New("no SSH identification string within " + timeout.String())
			}
			return nil, err
		}
	}
	if !bytes.HasPrefix(buf, []byte("SSH-2.0-")) && !bytes.HasPrefix(buf, []byte("SSH-1.99-")) {
		return nil, errNotSSH
	}
	if !stop() {
		// ctx ended just as the banner arrived.
		return nil, context.Cause(ctx)
	}
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		return nil, trace.Wrap(err)
	}
	return &replayConn{Conn: conn, pending: buf}, nil
}

// replayConn is a net.Conn whose first reads return bytes already read
// from it.
type replayConn struct {
	net.Conn
	// pending is read before Conn. Only the reading goroutine touches it
	// (a net.Conn has one reader at a time).
	pending []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// Buffered is how many replayed bytes are still to be read, and Unwrap the
// socket under it: utils.Splice waits on a quiet socket without a
// goroutine (its poller), which it finds through Unwrap, and must not wait
// while bytes it has not read yet are here.
func (c *replayConn) Buffered() int { return len(c.pending) }

// Unwrap returns the underlying connection.
func (c *replayConn) Unwrap() net.Conn { return c.Conn }

// CloseWrite half-closes the underlying connection (utils.Splice needs
// it to pass an EOF on without closing the other direction).
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
