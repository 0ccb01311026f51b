package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/service"
)

// TestProxyDescriptorLimit: a proxy process started with a descriptor
// limit (RLIMIT_NOFILE 300, soft and hard, as `ulimit -n` sets it, which
// the process cannot raise) that holds fewer sessions than its connection
// cap says so once at start, naming the limit and the sessions it allows
// ((300-256)/2 = 22), holds that many ssh -J sessions, and refuses the next
// connection at once naming the descriptor budget its listeners share (not a hang, not EMFILE somewhere
// in the process); a session that ends makes room again.
func TestProxyDescriptorLimit(t *testing.T) {
	const limit, sessions = 300, 22
	c := newAllInOne(t)
	m := joinRe.FindStringSubmatch(mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	port := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	d := &proxyDaemon{dataDir: t.TempDir()}
	d.sshAddr, d.webAddr, d.tunAddr, d.diagAddr = port(), port(), port(), port()
	args := []string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, limit), bin("postern"),
		"start", "--roles", "proxy", "--data-dir", d.dataDir, "--nodename", "edge-fd",
		"--auth-server", c.p.Addr(service.ListenerAuth).String(),
		"--ssh-addr", d.sshAddr, "--web-addr", d.webAddr, "--tunnel-addr", d.tunAddr, "--diag-addr", d.diagAddr, "--peer-addr", port(),
		"--token", m[1], "--ca-pin", m[2]}
	d.node = &nsNode{stderr: &syncBuffer{}}
	d.node.startPlain(t, "/bin/sh", args)
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + d.diagAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "proxy never ready:\n%s", d.node.stderr)
	require.Contains(t, d.node.stderr.String(),
		fmt.Sprintf("The file descriptor limit caps this proxy at %d concurrent SSH connections (RLIMIT_NOFILE %d, hard %d", sessions, limit, limit))

	cfg := c.clientConfig(t)
	cfg.Timeout = 10 * time.Second
	held := make([]*ssh.Client, 0, sessions)
	for i := range sessions {
		clt, err := jumpVia(t, cfg, d.sshAddr, c.hostname+":0")
		require.NoError(t, err, "session %d of %d", i+1, sessions)
		held = append(held, clt)
	}
	start := time.Now()
	_, err := jumpVia(t, cfg, d.sshAddr, c.hostname+":0")
	require.Error(t, err, "one session past what the descriptors hold")
	require.Contains(t, err.Error(), fmt.Sprintf("the file descriptor budget of %d is spent (this process's file descriptor limit, RLIMIT_NOFILE %d, less 256 kept for the rest of the process; each connection here costs 2: %d sessions)", limit-256, limit, sessions))
	require.Less(t, time.Since(start), 5*time.Second, "refused at once, not after a timeout")

	require.NoError(t, held[0].Close())
	require.Eventually(t, func() bool {
		clt, err := jumpVia(t, cfg, d.sshAddr, c.hostname+":0")
		if err != nil {
			return false
		}
		clt.Close()
		return true
	}, 10*time.Second, 50*time.Millisecond, "a closed session makes room")
	require.NotContains(t, d.node.stderr.String(), "too many open files")
}
