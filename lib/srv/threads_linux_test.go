package srv

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// osThreads is this process's thread count (/proc/self/status).
func osThreads(t *testing.T) int {
	data, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// TestIdleSessionsHoldNoThread: sessions whose process runs but does
// nothing (cat waiting on its stdin) do not each hold an OS thread in the
// node: the wait for the process parks in the poller (waitExited), not in
// a blocking waitid(2). Without it the thread count grows by one per
// session.
func TestIdleSessionsHoldNoThread(t *testing.T) {
	const n = 24
	e := newTestEnv(t)
	c := e.dial()
	before := osThreads(t)
	var sessions []*ssh.Session
	for range n {
		s, err := c.NewSession()
		require.NoError(t, err)
		_, err = s.StdinPipe()
		require.NoError(t, err)
		out, err := s.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, s.Start("echo up; exec cat"))
		buf := make([]byte, 3)
		_, err = out.Read(buf)
		require.NoError(t, err)
		require.Equal(t, "up\n", string(buf))
		sessions = append(sessions, s)
	}
	grew := osThreads(t) - before
	t.Logf("%d idle sessions: %d more OS threads", n, grew)
	require.Less(t, grew, n/2, "OS threads per idle session")
	for _, s := range sessions {
		s.Close()
	}
}
