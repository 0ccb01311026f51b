package srv

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClientVanishesMidHandshake: clients that disappear or stall during
// the handshake cost nothing once they are gone; goleak in TestMain proves
// no goroutine survives them.
func TestClientVanishesMidHandshake(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.HandshakeTimeout = 300 * time.Millisecond })

	t.Run("closes at once", func(t *testing.T) {
		conn, err := net.Dial("tcp", e.addr)
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	})
	t.Run("closes after the version line", func(t *testing.T) {
		conn, err := net.Dial("tcp", e.addr)
		require.NoError(t, err)
		_, err = conn.Write([]byte("SSH-2.0-vanishing\r\n"))
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	})
	t.Run("sends garbage", func(t *testing.T) {
		conn, err := net.Dial("tcp", e.addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		require.NoError(t, err)
		// The server gives up on the connection; reading ends.
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err = io.Copy(io.Discard, conn)
		require.NoError(t, err, "the server closed the connection")
	})
	t.Run("stalls past the handshake timeout", func(t *testing.T) {
		conn, err := net.Dial("tcp", e.addr)
		require.NoError(t, err)
		defer conn.Close()
		// Say nothing: the server must hang up on its own. The deadline
		// here only bounds the test if the server never does.
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err = io.Copy(io.Discard, conn)
		require.NoError(t, err, "the server hung up on a stalled handshake")
	})
}
