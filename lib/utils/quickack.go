package utils

import (
	"net"
	"sync/atomic"
	"syscall"
)

// QuickAckConn wraps an accepted TCP connection for the SSH handshake and
// re-arms TCP_QUICKACK around every read until Stop.
//
// Why: an OpenSSH client sends its first packets (KEX_ECDH_INIT,
// SERVICE_REQUEST, the first USERAUTH_REQUEST) before it sets TCP_NODELAY,
// so Nagle holds a small segment back until the previous one is
// acknowledged. Linux delays the ACK of a segment that has no reply ready
// (delayed ACK, up to ~40 ms) and leaves quick-ack mode after the first
// few segments, so at two points of every handshake the client waits on an
// ACK the server is waiting to piggyback on an answer it cannot compute
// until the held segment arrives: two ~40 ms stalls, about 80 ms of an
// `ssh -J` setup (measured: /work/shared/NOTES.md). TCP_QUICKACK is not
// sticky (tcp(7): the kernel may leave quick-ack mode again), hence set
// before and after each read, where the ACK decision is made.
//
// After the handshake the client has set TCP_NODELAY and the conversation
// is request/response or bulk data, where delayed ACKs save packets: Stop
// turns the re-arming off (one atomic load per read remains).
type QuickAckConn struct {
	net.Conn
	raw syscall.RawConn // nil when nc is not a TCP socket: no-op
	on  atomic.Bool
}

// NewQuickAckConn wraps nc. Wrappers that expose Unwrap() net.Conn (the
// limiter's) are looked through to find the TCP socket.
func NewQuickAckConn(nc net.Conn) *QuickAckConn {
	c := &QuickAckConn{Conn: nc}
	inner := nc
	for inner != nil {
		if sc, ok := inner.(syscall.Conn); ok {
			if raw, err := sc.SyscallConn(); err == nil {
				c.raw = raw
			}
			break
		}
		u, ok := inner.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		inner = u.Unwrap()
	}
	c.on.Store(c.raw != nil)
	if c.raw != nil {
		quickAck(c.raw)
	}
	return c
}

// Read reads from the connection, re-arming TCP_QUICKACK around it while
// the handshake lasts.
func (c *QuickAckConn) Read(p []byte) (int, error) {
	if !c.on.Load() {
		return c.Conn.Read(p)
	}
	quickAck(c.raw)
	n, err := c.Conn.Read(p)
	if c.on.Load() {
		quickAck(c.raw)
	}
	return n, err
}

// Stop ends the re-arming; the kernel's default ACK policy applies again.
func (c *QuickAckConn) Stop() { c.on.Store(false) }

// Unwrap returns the wrapped connection.
func (c *QuickAckConn) Unwrap() net.Conn { return c.Conn }
