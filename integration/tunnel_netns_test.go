package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// syncBuffer is a bytes.Buffer safe to read while a process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nsNode is a `postern start --roles node --proxy-server` process running
// inside a network namespace.
type nsNode struct {
	cmd     *exec.Cmd
	dataDir string
	stderr  *syncBuffer
	done    chan error
	// args are the arguments of the last start, for a restart.
	args []string
}

// startNSNode starts the node binary in ns, joined through the proxy's
// web address (as the namespace reaches it), and waits for its record.
func startNSNode(t *testing.T, ns *netNS, c *allInOne, clt *auth.Client, name string, extra ...string) (*nsNode, services.Node) {
	t.Helper()
	token, pin := nodeToken(t, c.dataDir)
	dir := t.TempDir()
	_, webPort, err := net.SplitHostPort(c.p.Addr(service.ListenerWeb).String())
	require.NoError(t, err)
	args := append([]string{"start", "--roles", "node", "--data-dir", dir, "--nodename", name, "--labels", "env=it",
		"--proxy-server", net.JoinHostPort(ns.hostIP, webPort), "--token", token, "--ca-pin", pin,
		"--diag-addr", "127.0.0.1:0"}, extra...)
	n := &nsNode{dataDir: dir, stderr: &syncBuffer{}, done: make(chan error, 1)}
	n.start(t, ns, args)
	var rec services.Node
	require.Eventually(t, func() bool {
		nodes, err := clt.GetNodes(context.Background(), clusterName)
		if err != nil {
			return false
		}
		for _, x := range nodes {
			if x.Hostname == name {
				rec = x
				return true
			}
		}
		select {
		case err := <-n.done:
			n.done <- err
			t.Fatalf("the node in %s exited: %v\n%s", ns.name, err, n.stderr.String())
		default:
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "node %s never heartbeat; its log:\n%s", name, n.stderr)
	return n, rec
}

func (n *nsNode) start(t *testing.T, ns *netNS, args []string) {
	t.Helper()
	n.args = args
	n.cmd = ns.command(bin("postern"), args...)
	n.cmd.Stderr = n.stderr
	n.done = make(chan error, 1)
	require.NoError(t, n.cmd.Start())
	cmd, done := n.cmd, n.done
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		err := <-done
		done <- err
	})
}

// nsEcho serves an echo on 0.0.0.0:port inside the namespace: a service
// on the machine behind NAT that only a tunnel can reach.
func nsEcho(t *testing.T, ns *netNS, port int) {
	t.Helper()
	script := fmt.Sprintf(`
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", %d)); s.listen(16); print("ready", flush=True)
def serve(c):
    while True:
        b = c.recv(65536)
        if not b: break
        c.sendall(b)
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
`, port)
	cmd := ns.command("/usr/bin/python3", "-c", script)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
}

// newNATCluster is an all-in-one whose web and tunnel ports listen on the
// host side of ns's veth (its proxy SSH port stays on loopback: only
// clients on the host use it), with that address among the proxy's
// public names, so the node in the namespace verifies the proxy's host
// certificate for it.
func newNATCluster(t *testing.T, ns *netNS) *allInOne {
	t.Helper()
	return newAllInOneWith(t, func(cfg *config.Config) {
		cfg.WebAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.TunnelAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.PublicAddrs = []string{ns.hostIP}
	})
}

// natSSHConfig is an ssh_config reaching host (a tunnel node, port 22 as
// typed) through the proxy with strict host key checking against the
// cluster's host CA.
func (c *allInOne) natSSHConfig(t *testing.T, host string) string {
	t.Helper()
	proxyPort := c.p.Addr(service.ListenerProxySSH).(*net.TCPAddr).Port
	cfg := fmt.Sprintf(`Host proxy
  HostName 127.0.0.1
  Port %d
Host %s
  ProxyJump proxy
Host *
  User %s
  IdentityFile %s
  CertificateFile %s-cert.pub
  IdentitiesOnly yes
  UserKnownHostsFile %s.known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
  ExitOnForwardFailure yes
`, proxyPort, host, c.login, c.keyPath, c.keyPath, c.keyPath)
	path := filepath.Join(t.TempDir(), "ssh_config")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}

// echoRoundTrip writes msg to addr and expects it back.
func echoRoundTrip(addr, msg string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo: got %q", buf)
	}
	return nil
}

// TestNodeInNetworkNamespace: a node process in a network namespace that
// nothing can connect into (nft drops new inbound connections) joins
// through the proxy's HTTPS port and is reached through its tunnel on
// every client path with real clients: OpenSSH ssh -J with strict host
// key checking, the proxy: subsystem (ProxyCommand), psh ssh, sftp and
// ssh -L to a service inside the namespace, while a direct dial of that
// service from the host gets no answer.
func TestNodeInNetworkNamespace(t *testing.T) {
	requireOpenSSH(t, "ssh", "sftp")
	ns := newNetNS(t)
	c := newNATCluster(t, ns)
	clt := adminClient(t, c.dataDir, c.p)
	_, rec := startNSNode(t, ns, c, clt, "natted")
	require.True(t, rec.Tunnel)
	require.Empty(t, rec.Addr)
	const echoPort = 2222
	nsEcho(t, ns, echoPort)
	cfg := c.natSSHConfig(t, "natted")

	t.Run("direct dial fails", func(t *testing.T) {
		requireUnreachable(t, net.JoinHostPort(ns.nsIP, fmt.Sprint(echoPort)))
		requireUnreachable(t, net.JoinHostPort(ns.nsIP, "22"))
	})
	t.Run("ssh -J", func(t *testing.T) {
		out, err := exec.Command("ssh", "-F", cfg, "natted", "echo jumped; echo $SSH_POSTERN_USER").CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "jumped\nalice\n", string(out))
	})
	t.Run("ssh -J by UUID", func(t *testing.T) {
		out, err := exec.Command("ssh", "-F", cfg, "-J", "proxy", rec.UUID, "echo by-uuid").CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "by-uuid\n", string(out))
	})
	t.Run("proxy subsystem", func(t *testing.T) {
		pc := fmt.Sprintf("ProxyCommand ssh -F %s proxy -s proxy:%%h:%%p@%s", cfg, clusterName)
		out, err := exec.Command("ssh", "-F", cfg, "-o", "ProxyJump=none", "-o", pc, "natted", "echo subsystem").CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "subsystem\n", string(out))
	})
	t.Run("psh ssh", func(t *testing.T) {
		e := newPshEnv(t, c)
		e.login(t, "alice", alicePassword+"\n")
		require.Equal(t, "psh-through-netns\n", e.mustRun(t, "", "ssh", "natted", "echo psh-through-netns"))
		require.Contains(t, e.mustRun(t, "", "ls"), "natted")
	})
	t.Run("sftp", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "src.bin")
		data := bytes.Repeat([]byte("tunnel-"), 256*1024)
		require.NoError(t, os.WriteFile(src, data, 0o600))
		remote, back := filepath.Join(dir, "remote.bin"), filepath.Join(dir, "back.bin")
		batch := filepath.Join(dir, "batch")
		require.NoError(t, os.WriteFile(batch, []byte(fmt.Sprintf("put %s %s\nget %s %s\n", src, remote, remote, back)), 0o600))
		out, err := exec.Command("sftp", "-F", cfg, "-b", batch, "natted").CombinedOutput()
		require.NoError(t, err, string(out))
		got, err := os.ReadFile(back)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got), "sftp round trip differs")
	})
	t.Run("web terminal", func(t *testing.T) {
		// The browser's path: the web terminal websocket, routed by the
		// same Router in-process, over the tunnel.
		wc := webTermLogin(t, c)
		natted := *c
		natted.hostname = "natted"
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ws, _, m := wc.open(t, ctx, &natted, "", "echo web-$((6*7))-$(hostname -I 2>/dev/null | tr -d ' ')\n", regexp.MustCompile(`web-42-(\S+)\r?\n`))
		ws.CloseNow()
		// The shell runs inside the namespace: its only address is the
		// veth's.
		require.Equal(t, ns.nsIP, m[1])
	})
	t.Run("ssh -L to a service behind NAT", func(t *testing.T) {
		lp := freePort(t)
		fwd := exec.Command("ssh", "-F", cfg, "-N", "-L", fmt.Sprintf("127.0.0.1:%d:127.0.0.1:%d", lp, echoPort), "natted")
		var errOut syncBuffer
		fwd.Stderr = &errOut
		require.NoError(t, fwd.Start())
		t.Cleanup(func() { _ = fwd.Process.Kill(); _ = fwd.Wait() })
		addr := fmt.Sprintf("127.0.0.1:%d", lp)
		require.Eventually(t, func() bool { return echoRoundTrip(addr, "through -L") == nil }, 20*time.Second, 100*time.Millisecond, "ssh -L: %s", &errOut)
	})
}

// startPlain runs name with args (outside any namespace).
func (n *nsNode) startPlain(t *testing.T, name string, args []string) {
	t.Helper()
	n.cmd = exec.Command(name, args...)
	n.cmd.Stderr = n.stderr
	n.done = make(chan error, 1)
	require.NoError(t, n.cmd.Start())
	cmd, done := n.cmd, n.done
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		err := <-done
		done <- err
	})
}

// waitTunnels waits until the proxy's postern_tunnels gauge is want,
// within d; it returns how long that took.
func waitTunnels(t *testing.T, p *service.Process, want float64, d time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool { return metric(getMetrics(t, p), "postern_tunnels") == want }, d, 20*time.Millisecond, what)
	return time.Since(start)
}

// waitLog waits until s has more than n occurrences of sub, within d.
func waitLog(t *testing.T, s *syncBuffer, sub string, n int, d time.Duration, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Count(s.String(), sub) > n }, d, 20*time.Millisecond, "%s; log:\n%s", what, s)
}

// TestHalfOpenTunnel: the path between the proxy and a node in a network
// namespace is blackholed (nft drops everything both ways: no RST, no
// ICMP, the TCP connection stays "up"). With the default keep-alives
// (5s x3) both ends notice within 20s; the node reconnects within 10s of
// the path's return. Then keep_alive_interval/keep_alive_count_max are
// changed in the cluster networking config while the tunnel runs: both
// ends apply them without a reconnect, and the next blackhole is noticed
// within the new bound.
func TestHalfOpenTunnel(t *testing.T) {
	ns := newNetNS(t)
	c := newNATCluster(t, ns)
	clt := adminClient(t, c.dataDir, c.p)
	n, _ := startNSNode(t, ns, c, clt, "halfopen")
	waitTunnels(t, c.p, 1, 20*time.Second, "the tunnel comes up")
	const lost = "no answer to keep-alives for"

	t.Run("default keep-alives", func(t *testing.T) {
		before := strings.Count(n.stderr.String(), lost)
		ns.blackhole(t)
		blackholed := time.Now()
		took := waitTunnels(t, c.p, 0, 20*time.Second, "the proxy drops the half-open tunnel")
		t.Logf("proxy noticed after %v", took)
		require.GreaterOrEqual(t, took, 10*time.Second, "not before the keep-alives could have failed")
		waitLog(t, n.stderr, lost, before, time.Until(blackholed.Add(20*time.Second)), "the node drops the half-open tunnel")
		ns.unblackhole(t)
		t.Logf("node reconnected %v after the path returned", waitTunnels(t, c.p, 1, 10*time.Second, "the node reconnects"))
	})
	t.Run("keep-alive settings changed at runtime", func(t *testing.T) {
		ctx := context.Background()
		cfg, err := clt.GetClusterNetworkingConfig(ctx)
		require.NoError(t, err)
		cfg.Spec.KeepAliveInterval = services.Duration(time.Second)
		cfg.Spec.KeepAliveCountMax = 2
		require.NoError(t, clt.SetClusterNetworkingConfig(ctx, cfg))
		waitLog(t, n.stderr, "keep_alive_interval=1s", 0, 20*time.Second, "the node hears the new settings")
		require.Equal(t, 1.0, metric(getMetrics(t, c.p), "postern_tunnels"), "no reconnect for a settings change")

		before := strings.Count(n.stderr.String(), lost+" 2s")
		ns.blackhole(t)
		blackholed := time.Now()
		took := waitTunnels(t, c.p, 0, 6*time.Second, "the proxy applies 1s x2")
		t.Logf("proxy noticed after %v", took)
		waitLog(t, n.stderr, lost+" 2s", before, time.Until(blackholed.Add(6*time.Second)), "the node applies 1s x2")
		ns.unblackhole(t)
		waitTunnels(t, c.p, 1, 10*time.Second, "the node reconnects")
	})
}
