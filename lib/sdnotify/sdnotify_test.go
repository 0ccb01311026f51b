package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// listen is a service manager's end: a unixgram socket at a fresh path.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func recv(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := conn.Read(buf)
	require.NoError(t, err)
	return string(buf[:n])
}

func TestMessages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	conn := listen(t, path)
	t.Setenv(SocketEnv, path)
	n := FromEnv()
	_, set := os.LookupEnv(SocketEnv)
	require.False(t, set, "children must not inherit NOTIFY_SOCKET")
	require.True(t, n.Enabled())

	require.NoError(t, n.Ready("serving\nauth"))
	require.Equal(t, "READY=1\nSTATUS=serving auth\n", recv(t, conn))
	require.NoError(t, n.Reloading())
	msg := recv(t, conn)
	require.True(t, strings.HasPrefix(msg, "RELOADING=1\nMONOTONIC_USEC="), msg)
	require.NoError(t, n.Stopping("draining"))
	require.Equal(t, "STOPPING=1\nSTATUS=draining\n", recv(t, conn))
}

func TestAbstractSocket(t *testing.T) {
	name := "@postern-sdnotify-test-" + filepath.Base(t.TempDir())
	conn := listen(t, name)
	require.NoError(t, New(name).Status("hello"))
	require.Equal(t, "STATUS=hello\n", recv(t, conn))
}

func TestNoSocketIsANoOp(t *testing.T) {
	t.Setenv(SocketEnv, "")
	n := FromEnv()
	require.False(t, n.Enabled())
	require.NoError(t, n.Ready("x"))
	var nilN *Notifier
	require.NoError(t, nilN.Stopping("x"))
}

func TestMissingSocketIsAnError(t *testing.T) {
	err := New(filepath.Join(t.TempDir(), "gone")).Ready("x")
	require.Error(t, err)
	require.Contains(t, err.Error(), "notifying the service manager")
}
