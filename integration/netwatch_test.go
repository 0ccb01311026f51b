package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
)

// TestNetworkingEditReachesJoinedNode: a joined node reads the cluster's
// recording settings from memory (a NetworkingWatcher on the auth API's
// networking watch, no auth round trip per session), yet `pctl create` of
// session_recording: off applies to the next session of a connection that
// is already open, and switching it back to node records again. Sessions
// cost the auth server no backend read of the networking config.
func TestNetworkingEditReachesJoinedNode(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	c.joinNode(t, "node-2", map[string]string{"env": "it"})
	waitNodes(t, clt, 2)
	open, err := c.viaJump(t, net.JoinHostPort("node-2", "0"))
	require.NoError(t, err)

	// recordedStarts counts node-2's session.start events by recorded.
	recordedStarts := func() (on, off int) {
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type != events.SessionStart || e.Fields[events.FieldServerHostname] != "node-2" {
				continue
			}
			if e.Fields[events.FieldRecorded] == true {
				on++
			} else {
				off++
			}
		}
		return on, off
	}
	session := func() {
		s, err := open.NewSession()
		require.NoError(t, err)
		defer s.Close()
		require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
		out, err := s.Output("echo hi")
		require.NoError(t, err)
		require.Contains(t, string(out), "hi")
	}
	set := func(mode string) {
		f := filepath.Join(t.TempDir(), "net.yaml")
		require.NoError(t, os.WriteFile(f, []byte("kind: cluster_networking_config\nmetadata:\n  name: cluster_networking_config\nspec:\n  session_recording: \""+mode+"\"\n"), 0o600))
		mustPctl(t, c.dataDir, "", "create", "-f", f)
	}

	session()
	require.Eventually(t, func() bool { on, _ := recordedStarts(); return on >= 1 }, 30*time.Second, 100*time.Millisecond,
		"the first session on node-2 is recorded (the default)")

	// Backend reads at auth while node-2 runs sessions: before the
	// watcher, each session read the networking config through the auth
	// API, which read the backend.
	const sessions = 10
	gets0 := backendGets(t, c)
	for range sessions {
		session()
	}
	gets := backendGets(t, c) - gets0
	t.Logf("backend gets at auth for %d sessions on node-2: %v", sessions, gets)
	require.Less(t, gets, float64(sessions), "a backend read per session")

	set("off")
	start := time.Now()
	require.Eventually(t, func() bool {
		session()
		_, off := recordedStarts()
		return off >= 1
	}, 15*time.Second, 200*time.Millisecond, "session_recording: off reaches the open connection's next session")
	t.Logf("session_recording off applied after %v", time.Since(start))

	on0, _ := recordedStarts()
	set("node")
	require.Eventually(t, func() bool {
		session()
		on, _ := recordedStarts()
		return on > on0
	}, 15*time.Second, 200*time.Millisecond, "session_recording: node records again")
}

// backendGets is the auth process's count of backend get operations (its
// /metrics).
func backendGets(t *testing.T, c *allInOne) float64 {
	t.Helper()
	resp, err := http.Get("http://" + c.p.Addr(service.ListenerDiag).String() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	const metric = `postern_backend_request_duration_seconds_count{op="get"} `
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), metric); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	require.NoError(t, sc.Err())
	return 0
}
