package integration

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// startNATNode joins a node through the proxy's HTTPS port alone
// (--proxy-server): no auth address, no listening port.
func startNATNode(t testing.TB, c *allInOne, name string) (*service.Process, string) {
	t.Helper()
	token, pin := nodeToken(t, c.dataDir)
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleNode)
	cfg.ProxyServer = c.p.Addr(service.ListenerWeb).String()
	cfg.Token, cfg.CAPin, cfg.NodeName = token, pin, name
	cfg.Labels = map[string]string{"env": "it"}
	return startProcess(t, cfg), dir
}

func getMetrics(t *testing.T, p *service.Process) string {
	t.Helper()
	resp, err := http.Get("http://" + p.Addr(service.ListenerDiag).String() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// pipeConn is a session's stdin/stdout as a net.Conn: the proxy:
// subsystem's byte stream, as OpenSSH's ProxyCommand sees it.
type pipeConn struct {
	io.Reader
	io.WriteCloser
}

func (pipeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (pipeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (pipeConn) SetDeadline(time.Time) error      { return nil }
func (pipeConn) SetReadDeadline(time.Time) error  { return nil }
func (pipeConn) SetWriteDeadline(time.Time) error { return nil }

// Close leaves stdin to the session's own (deferred) Close: x/crypto
// closes a transport from two goroutines.
func (p pipeConn) Close() error                { return nil }
func (p pipeConn) Write(b []byte) (int, error) { return p.WriteCloser.Write(b) }
func (p pipeConn) Read(b []byte) (int, error)  { return p.Reader.Read(b) }

// TestNodeBehindNAT: a node that joined through the proxy and listens
// nowhere is in the inventory as a tunnel node and is reached through
// the proxy on every path: ssh -J (direct-tcpip), the proxy: subsystem
// and psh ssh. Its heartbeats and auth calls ride the tunnel (it was
// never given the auth address).
func TestNodeBehindNAT(t *testing.T) {
	c := newAllInOne(t)
	n, dir := startNATNode(t, c, "natted")
	require.Nil(t, n.Addr(service.ListenerNode), "a node behind NAT opens no listening port")

	clt := adminClient(t, c.dataDir, c.p)
	waitNodes(t, clt, 2)
	rec := nodeByUUID(t, clt, n.HostUUID())
	require.True(t, rec.Tunnel)
	require.Empty(t, rec.Addr)
	require.Equal(t, "natted", rec.Hostname)

	for _, target := range []string{"natted:22", n.HostUUID() + ":0", "natted." + clusterName + ":0"} {
		t.Run("ssh -J "+target, func(t *testing.T) {
			sc, err := c.viaJump(t, target)
			require.NoError(t, err)
			out, err := run(t, sc, "echo hello; echo $SSH_POSTERN_USER")
			require.NoError(t, err)
			require.Equal(t, "hello\nalice\n", out)
		})
	}

	t.Run("the node audits the client's address", func(t *testing.T) {
		// The transport channel names the client: the node's own
		// session.start says where the user came from, not "tunnel".
		cfg := c.clientConfig(t)
		proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
		require.NoError(t, err)
		defer proxy.Close()
		conn, err := proxy.Dial("tcp", "natted:22")
		require.NoError(t, err)
		sconn, chans, reqs, err := ssh.NewClientConn(conn, "natted:22", cfg)
		require.NoError(t, err)
		nc := ssh.NewClient(sconn, chans, reqs)
		defer nc.Close()
		since := time.Now().Add(-time.Second)
		_, err = run(t, nc, "echo audited")
		require.NoError(t, err)
		client := proxy.LocalAddr().String()
		require.Eventually(t, func() bool {
			evs, err := clt.SearchEvents(context.Background(), since, events.SessionStart, 100)
			if err != nil {
				return false
			}
			for _, e := range evs {
				if e.Fields[events.FieldServerHostname] == "natted" && e.Fields[events.FieldRemoteAddr] == client {
					return true
				}
			}
			return false
		}, 20*time.Second, 100*time.Millisecond, "a session.start on natted from %s", client)
	})

	t.Run("the session has SSH_CLIENT and SSH_CONNECTION as on a direct node", func(t *testing.T) {
		// OpenSSH sets both from the connection's ends and scripts (and
		// bash, which reads ~/.bashrc for a command only when SSH_CLIENT
		// is set) rely on them: a tunnel node gives the client's address,
		// as the proxy saw it, and its own end of the tunnel.
		cfg := c.clientConfig(t)
		proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
		require.NoError(t, err)
		defer proxy.Close()
		conn, err := proxy.Dial("tcp", "natted:22")
		require.NoError(t, err)
		sconn, chans, reqs, err := ssh.NewClientConn(conn, "natted:22", cfg)
		require.NoError(t, err)
		nc := ssh.NewClient(sconn, chans, reqs)
		defer nc.Close()
		out, err := run(t, nc, `echo "$SSH_CLIENT"; echo "$SSH_CONNECTION"`)
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		require.Len(t, lines, 2, "%q", out)
		client := proxy.LocalAddr().(*net.TCPAddr)
		cli := strings.Fields(lines[0])
		require.Len(t, cli, 3, "SSH_CLIENT=%q", lines[0])
		require.Equal(t, []string{client.IP.String(), strconv.Itoa(client.Port)}, cli[:2], "SSH_CLIENT=%q", lines[0])
		cn := strings.Fields(lines[1])
		require.Len(t, cn, 4, "SSH_CONNECTION=%q", lines[1])
		require.Equal(t, cli[:2], cn[:2], "SSH_CONNECTION=%q", lines[1])
		require.Equal(t, cli[2], cn[3], "SSH_CONNECTION=%q", lines[1])
		require.NotNil(t, net.ParseIP(cn[2]), "SSH_CONNECTION=%q", lines[1])
	})

	t.Run("proxy subsystem", func(t *testing.T) {
		cfg := c.clientConfig(t)
		proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
		require.NoError(t, err)
		defer proxy.Close()
		s, err := proxy.NewSession()
		require.NoError(t, err)
		defer s.Close()
		stdin, err := s.StdinPipe()
		require.NoError(t, err)
		stdout, err := s.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, s.RequestSubsystem("proxy:natted:0@"+clusterName))
		sconn, chans, reqs, err := ssh.NewClientConn(pipeConn{stdout, stdin}, "natted:22", cfg)
		require.NoError(t, err)
		nc := ssh.NewClient(sconn, chans, reqs)
		defer nc.Close()
		out, err := run(t, nc, "echo via-subsystem")
		require.NoError(t, err)
		require.Equal(t, "via-subsystem\n", out)
	})

	t.Run("psh ssh", func(t *testing.T) {
		e := newPshEnv(t, c)
		e.login(t, "alice", alicePassword+"\n")
		out := e.mustRun(t, "", "ssh", "natted", "echo psh-through-tunnel")
		require.Equal(t, "psh-through-tunnel\n", out)
		ls := e.mustRun(t, "", "ls")
		require.Contains(t, ls, "natted")
	})

	t.Run("pctl tokens add prints both join commands", func(t *testing.T) {
		out := mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node")
		require.Contains(t, out, "postern start --roles node --auth-server ")
		require.Regexp(t, `postern start --roles node --proxy-server \S+:3080 --token \S+ --ca-pin sha256:[0-9a-f]+`, out)
	})

	t.Run("pctl route says tunnel", func(t *testing.T) {
		out := mustPctl(t, c.dataDir, "", "route", "natted")
		// pctl routes on its own (it holds no tunnels): it says how.
		require.Contains(t, out, "via:        its reverse tunnel", out)
	})

	t.Run("restart reuses the identity", func(t *testing.T) {
		stopProcess(t, n)
		cfg := procConfig(dir, config.RoleNode)
		cfg.ProxyServer = c.p.Addr(service.ListenerWeb).String()
		cfg.NodeName = "natted"
		cfg.Labels = map[string]string{"env": "it"}
		n2 := startProcess(t, cfg)
		require.Equal(t, rec.UUID, n2.HostUUID())
		require.Eventually(t, func() bool {
			sc, err := c.viaJump(t, "natted:22")
			if err != nil {
				return false
			}
			out, err := run(t, sc, "echo back")
			return err == nil && out == "back\n"
		}, 20*time.Second, 100*time.Millisecond)
	})
}

// TestTunnelNodeOfflineAtTimeout: a tunnel node whose tunnel never
// reaches the proxy fails the dial with the offline error once
// tunnel_find_timeout has passed (shortened here), and the timeout is
// counted on /metrics.
func TestTunnelNodeOfflineAtTimeout(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	ctx := context.Background()
	require.NoError(t, clt.SetClusterNetworkingConfig(ctx, &services.ClusterNetworkingConfig{
		Spec: services.ClusterNetworkingConfigSpec{TunnelFindTimeout: services.Duration(time.Second)},
	}))
	n, _ := startNATNode(t, c, "gone")
	waitNodes(t, clt, 2)
	// The node goes away; its record outlives it until its TTL.
	stopProcess(t, n)

	var err error
	var took time.Duration
	require.Eventually(t, func() bool {
		start := time.Now()
		_, err = c.viaJump(t, "gone:22")
		took = time.Since(start)
		return err != nil && strings.Contains(err.Error(), "is offline")
	}, 20*time.Second, 100*time.Millisecond, "last: %v", err)
	require.Contains(t, unquote(err.Error()), `node "gone" is offline: no tunnel reached this proxy within 1s`)
	require.GreaterOrEqual(t, took, 900*time.Millisecond)

	body := getMetrics(t, c.p)
	require.Contains(t, body, "postern_tunnel_routing_timeout_total 1")
	require.Contains(t, body, `postern_tunnel_routing_duration_seconds_count{result="timeout"} 1`)
}
