package utils

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// wrapped hides the *net.TCPConn the way the limiter's conn does.
type wrapped struct{ net.Conn }

func (w wrapped) Unwrap() net.Conn { return w.Conn }

func quickAckOf(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	var v int
	var serr error
	require.NoError(t, raw.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK) }))
	require.NoError(t, serr)
	return v
}

func setQuickAck(t *testing.T, c *net.TCPConn, v int) {
	t.Helper()
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	require.NoError(t, raw.Control(func(fd uintptr) {
		require.NoError(t, unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, v))
	}))
}

// TestQuickAckConn: through a wrapper that only offers Unwrap, each Read
// during the handshake leaves the socket in quick-ack mode (the kernel
// had been put in delayed-ACK "pingpong" mode before it); after Stop,
// reads leave the kernel's choice alone.
func TestQuickAckConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	sc, err := ln.Accept()
	require.NoError(t, err)
	defer sc.Close()
	server := sc.(*net.TCPConn)

	qc := NewQuickAckConn(wrapped{server})
	buf := make([]byte, 16)
	for i := 0; i < 3; i++ {
		setQuickAck(t, server, 0)
		require.Equal(t, 0, quickAckOf(t, server), "the kernel reports delayed-ACK mode")
		_, err = client.Write([]byte("SSH-2.0-x\r\n"))
		require.NoError(t, err)
		_, err = qc.Read(buf)
		require.NoError(t, err)
		require.Equal(t, 1, quickAckOf(t, server), "read %d: quick-ack re-armed", i)
	}

	qc.Stop()
	setQuickAck(t, server, 0)
	_, err = client.Write([]byte("data"))
	require.NoError(t, err)
	_, err = qc.Read(buf)
	require.NoError(t, err)
	require.Equal(t, 0, quickAckOf(t, server), "after Stop the kernel's mode stays")
}

// TestQuickAckConnNotTCP: a connection without a socket passes through.
func TestQuickAckConnNotTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	qc := NewQuickAckConn(a)
	go func() { _, _ = b.Write([]byte("x")) }()
	buf := make([]byte, 1)
	n, err := qc.Read(buf)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
