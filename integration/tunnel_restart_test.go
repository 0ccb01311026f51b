package integration

import (
	"fmt"
	"io"
	"net/http"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// proxyDaemon is a proxy-only `postern start` process on fixed ports, so
// that it can be killed and started again at the same addresses.
type proxyDaemon struct {
	node                                *nsNode // the process (not in a namespace)
	dataDir                             string
	sshAddr, webAddr, tunAddr, diagAddr string
	args                                []string
}

func startProxyDaemon(t *testing.T, authDir string, a *service.Process, name string) *proxyDaemon {
	t.Helper()
	m := joinRe.FindStringSubmatch(mustPctl(t, authDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	d := &proxyDaemon{dataDir: t.TempDir()}
	port := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	d.sshAddr, d.webAddr, d.tunAddr, d.diagAddr = port(), port(), port(), port()
	d.args = []string{"start", "--roles", "proxy", "--data-dir", d.dataDir, "--nodename", name,
		"--auth-server", a.Addr(service.ListenerAuth).String(),
		"--ssh-addr", d.sshAddr, "--web-addr", d.webAddr, "--tunnel-addr", d.tunAddr, "--diag-addr", d.diagAddr, "--peer-addr", port()}
	d.start(t, "--token", m[1], "--ca-pin", m[2])
	return d
}

// start runs the binary and waits until its diagnostics answer /readyz.
func (d *proxyDaemon) start(t *testing.T, extra ...string) {
	t.Helper()
	d.node = &nsNode{stderr: &syncBuffer{}}
	d.node.startPlain(t, bin("postern"), append(append([]string{}, d.args...), extra...))
	require.Eventually(t, func() bool {
		select {
		case err := <-d.node.done:
			d.node.done <- err
			t.Fatalf("the proxy exited: %v\n%s", err, d.node.stderr.String())
		default:
		}
		resp, err := http.Get("http://" + d.diagAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 20*time.Millisecond, "proxy never ready:\n%s", d.node.stderr)
}

// kill9 is SIGKILL: no drain, no goodbye to the tunnels.
func (d *proxyDaemon) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, d.node.cmd.Process.Kill())
	err := <-d.node.done
	d.node.done <- err
}

func (d *proxyDaemon) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + d.diagAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// metric returns the value of the sample line name (labels included), or
// -1 when absent.
func metric(body, name string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

// jumpVia dials target through the proxy SSH port at proxyAddr as
// direct-tcpip (ssh -J) and returns the node client.
func jumpVia(t *testing.T, cfg *ssh.ClientConfig, proxyAddr, target string) (*ssh.Client, error) {
	t.Helper()
	proxy, err := ssh.Dial("tcp", proxyAddr, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { proxy.Close() })
	conn, err := proxy.Dial("tcp", target)
	if err != nil {
		return nil, err
	}
	sconn, chans, reqs, err := ssh.NewClientConn(conn, target, cfg)
	if err != nil {
		return nil, err
	}
	clt := ssh.NewClient(sconn, chans, reqs)
	// The jump connection ends with the node's: a proxy draining on
	// SIGTERM waits for its client connections.
	go func() { _ = clt.Wait(); proxy.Close() }()
	t.Cleanup(func() { clt.Close() })
	return clt, nil
}

// startNATNodeVia joins an in-process node behind NAT through the proxy
// web address webAddr.
func startNATNodeVia(t *testing.T, authDir, webAddr, name string) *service.Process {
	t.Helper()
	token, pin := nodeToken(t, authDir)
	cfg := procConfig(t.TempDir(), config.RoleNode)
	cfg.ProxyServer, cfg.Token, cfg.CAPin, cfg.NodeName = webAddr, token, pin, name
	return startProcess(t, cfg)
}

// TestProxyKilledAndRestarted: kill -9 of the proxy, then the same proxy
// again at the same addresses: every tunnel is back within 10s; a
// session opened 1s after the restart succeeds (the find waits for the
// tunnel); one to a node that never comes back fails at
// tunnel_find_timeout (5s, +-10%) with the documented error, counted in
// postern_tunnel_routing_timeout_total on /metrics.
func TestProxyKilledAndRestarted(t *testing.T) {
	authDir := t.TempDir()
	a := startProcess(t, procConfig(authDir, config.RoleAuth))
	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, authDir, alicePassword+"\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, authDir, "", "auth", "sign", "--user", "alice", "--ttl", "10m", "--out", keyPath)
	c := &allInOne{p: a, dataDir: authDir, login: u.Username, keyPath: keyPath}
	cfg := c.clientConfig(t)

	d := startProxyDaemon(t, authDir, a, "edge")
	const live = 3
	for i := range live {
		startNATNodeVia(t, authDir, d.webAddr, fmt.Sprintf("nat-%d", i))
	}
	gone := startNATNodeVia(t, authDir, d.webAddr, "gone")
	require.Eventually(t, func() bool { return metric(d.metrics(t), "postern_tunnels") == live+1 }, 20*time.Second, 50*time.Millisecond)
	sc, err := jumpVia(t, cfg, d.sshAddr, "nat-0:22")
	require.NoError(t, err)
	out, err := run(t, sc, "echo before")
	require.NoError(t, err)
	require.Equal(t, "before\n", out)
	// The node that never comes back: stopped cleanly; its record lives
	// on until its TTL, so routing still picks it.
	stopProcess(t, gone)

	d.kill9(t)
	restarted := time.Now()
	d.start(t)

	t.Run("a session 1s after the restart succeeds", func(t *testing.T) {
		time.Sleep(time.Until(restarted.Add(time.Second))) // the scenario's own timing, not a wait for a condition
		sc, err := jumpVia(t, cfg, d.sshAddr, "nat-1:22")
		require.NoError(t, err)
		out, err := run(t, sc, "echo after")
		require.NoError(t, err)
		require.Equal(t, "after\n", out)
	})
	t.Run("every tunnel is back within 10s", func(t *testing.T) {
		require.Eventually(t, func() bool { return metric(d.metrics(t), "postern_tunnels") == live }, time.Until(restarted.Add(10*time.Second)), 50*time.Millisecond,
			"tunnels: %v", metric(d.metrics(t), "postern_tunnels"))
		for i := range live {
			sc, err := jumpVia(t, cfg, d.sshAddr, fmt.Sprintf("nat-%d:22", i))
			require.NoError(t, err)
			_, err = run(t, sc, "true")
			require.NoError(t, err)
		}
	})
	t.Run("a node that never returns fails at the timeout", func(t *testing.T) {
		before := metric(d.metrics(t), "postern_tunnel_routing_timeout_total")
		require.GreaterOrEqual(t, before, 0.0)
		proxy, err := ssh.Dial("tcp", d.sshAddr, cfg)
		require.NoError(t, err)
		defer proxy.Close()
		start := time.Now()
		_, err = proxy.Dial("tcp", "gone:22")
		took := time.Since(start)
		require.Error(t, err)
		require.Contains(t, unquote(err.Error()), `node "gone" is offline: no tunnel reached this proxy within 5s`)
		require.InDelta(t, 5*time.Second, took, float64(500*time.Millisecond), "took %v", took)
		body := d.metrics(t)
		require.Equal(t, before+1, metric(body, "postern_tunnel_routing_timeout_total"))
		require.True(t, strings.Contains(body, `postern_tunnel_routing_duration_seconds_count{result="timeout"}`))
	})
}
