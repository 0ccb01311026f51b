package proxy

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// frozenListener is a node that froze after saying hello: it accepts,
// sends its SSH banner and then never reads again (a SIGSTOPped process:
// the kernel still ACKs keep-alive probes, but the receive window closes
// once its small buffer is full).
func frozenListener(t *testing.T) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(conns)
			return
		}
		c.Write([]byte("SSH-2.0-frozen\r\n"))
		conns <- c // held open, never read
	}()
	t.Cleanup(func() {
		ln.Close()
		if c, ok := <-conns; ok {
			c.Close()
		}
	})
	return ln
}

// TestDialHostFrozenNode: the proxy -> node leg only splices, so a frozen
// node must be noticed by TCP. With TCPUserTimeout configured (short, for
// the test), data the node never takes fails the connection with
// ETIMEDOUT within a bound, which ends the splice and the user's session;
// without it the write would block for the kernel's ~15 minutes.
func TestDialHostFrozenNode(t *testing.T) {
	ln := frozenListener(t)
	env := newRouterEnvWith(t, []services.Node{node("f", "frozen", ln.Addr().String(), 0)}, func(c *RouterConfig) {
		c.KeepAlive = net.KeepAliveConfig{Idle: time.Second, Interval: time.Second, Count: 2}
		c.TCPUserTimeout = time.Second
	})
	conn, _, err := env.router.DialHost(context.Background(), RouteRequest{Target: Target{Host: "frozen"}})
	require.NoError(t, err)
	defer conn.Close()

	const bound = 20 * time.Second
	start := time.Now()
	// The test's own backstop: a deadline far beyond the bound, so a
	// regression fails instead of hanging.
	require.NoError(t, conn.SetWriteDeadline(start.Add(2*bound)))
	buf := make([]byte, 32<<10)
	for {
		if _, err = conn.Write(buf); err != nil {
			break
		}
	}
	require.Less(t, time.Since(start), bound, "the frozen node was noticed too late")
	require.True(t, errors.Is(err, syscall.ETIMEDOUT), "want ETIMEDOUT from TCP_USER_TIMEOUT, got %v", err)
}
