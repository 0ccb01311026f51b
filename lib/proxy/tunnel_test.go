package proxy

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/reversetunnel"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// tunnelEnv is a real tunnel server on loopback; startAgent connects a
// real agent for a node whose "SSH server" sends a banner and echoes.
type tunnelEnv struct {
	ca   *srvtest.CA
	srv  *reversetunnel.Server
	addr string
}

func newTunnelEnv(t *testing.T) *tunnelEnv {
	t.Helper()
	ca := srvtest.NewCA(t)
	s, err := reversetunnel.NewServer(reversetunnel.ServerConfig{
		HostSigner: ca.RoleHostSigner(t, srvtest.HostCert{UUID: "proxy", Role: reversetunnel.RoleProxy, Principals: []string{"127.0.0.1"}}),
		HostCAs:    func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey()} },
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { s.Close() })
	return &tunnelEnv{ca: ca, srv: s, addr: ln.Addr().String()}
}

func (e *tunnelEnv) startAgent(t *testing.T, uuid string) {
	t.Helper()
	a, err := reversetunnel.NewAgent(reversetunnel.AgentConfig{
		ProxyAddr: e.addr,
		Signer:    e.ca.RoleHostSigner(t, srvtest.HostCert{UUID: uuid, Role: reversetunnel.RoleNode}),
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{e.ca.Signer.PublicKey()} },
		Handler: func(nc net.Conn) {
			_, _ = nc.Write([]byte("SSH-2.0-tunnel-node\r\n"))
			_, _ = io.Copy(nc, nc)
			nc.Close()
		},
	})
	require.NoError(t, err)
	a.Start()
	t.Cleanup(func() { a.Close() })
}

func (e *routerEnv) histogramCount(t *testing.T, name, result string) uint64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

func readBanner(t *testing.T, conn net.Conn) {
	t.Helper()
	_, err := conn.Write([]byte("x"))
	require.NoError(t, err)
	buf := make([]byte, len("SSH-2.0-tunnel-node\r\nx"))
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.Equal(t, "SSH-2.0-tunnel-node\r\nx", string(buf))
}

type dialResult struct {
	conn net.Conn
	err  error
}

func (e *routerEnv) dialAsync(ctx context.Context, host string) <-chan dialResult {
	ch := make(chan dialResult, 1)
	go func() {
		c, _, err := e.router.DialHost(ctx, RouteRequest{Target: Target{Host: host}, Source: "198.51.100.1:4000"})
		ch <- dialResult{c, err}
	}()
	return ch
}

// TestDialHostTunnel: the dialer order and find-with-timeout, with a real
// tunnel server and agents on loopback and the Router on a fake clock.
func TestDialHostTunnel(t *testing.T) {
	ctx := context.Background()
	tun := newTunnelEnv(t)
	dialer := &recordingDialer{}
	routerClock := clockwork.NewFakeClockAt(t0)
	env := newRouterEnvWith(t, []services.Node{
		{UUID: "tn", Hostname: "natted", Cluster: testCluster, Tunnel: true},
		{UUID: "never", Hostname: "never", Cluster: testCluster, Tunnel: true},
		node("both", "both", "127.0.0.1:9", 0),
	}, func(c *RouterConfig) {
		c.Dialer = dialer
		c.Tunnels = tun.srv
		c.Clock = routerClock
	})
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	// A tunnel node whose tunnel arrives while the dial waits.
	res := env.dialAsync(ctx, "natted")
	require.NoError(t, routerClock.BlockUntilContext(waitCtx, 1), "the dial waits on the find timer")
	require.Contains(t, env.router.ExplainTarget(ctx, Target{Host: "natted"}).String(), "none on this proxy now")
	routerClock.Advance(4 * time.Second) // within the 5s default
	tun.startAgent(t, "tn")
	r := <-res
	require.NoError(t, r.err)
	readBanner(t, r.conn)
	r.conn.Close()
	require.Equal(t, uint64(1), env.histogramCount(t, "postern_tunnel_routing_duration_seconds", "found"))
	require.Contains(t, env.router.ExplainTarget(ctx, Target{Host: "natted"}).String(), "via:        tunnel on this proxy")

	// A node that never comes: the offline error at the timeout, counted.
	res = env.dialAsync(ctx, "never")
	require.NoError(t, routerClock.BlockUntilContext(waitCtx, 1))
	routerClock.Advance(5*time.Second - time.Millisecond)
	select {
	case r := <-res:
		t.Fatalf("gave up before the timeout: %v", r.err)
	default:
	}
	routerClock.Advance(time.Millisecond)
	r = <-res
	require.True(t, trace.IsConnectionProblem(r.err), "%v", r.err)
	require.Equal(t, `node "never" is offline: no tunnel reached this proxy within 5s`, r.err.Error())
	require.Equal(t, 1.0, env.counter(t, "postern_tunnel_routing_timeout_total"))
	require.Equal(t, uint64(1), env.histogramCount(t, "postern_tunnel_routing_duration_seconds", "timeout"))

	// A caller that gives up while waiting.
	cctx, ccancel := context.WithCancel(ctx)
	res = env.dialAsync(cctx, "never")
	require.NoError(t, routerClock.BlockUntilContext(waitCtx, 1))
	ccancel()
	r = <-res
	require.ErrorContains(t, r.err, "canceled while waiting for its tunnel")
	require.Equal(t, uint64(1), env.histogramCount(t, "postern_tunnel_routing_duration_seconds", "canceled"))

	// A node with an address and a tunnel here goes over the tunnel.
	tun.startAgent(t, "both")
	reg := tun.srv.TunnelRegistered("both")
	if !tun.srv.HasTunnel("both") {
		<-reg
	}
	c, route, err := env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "both"}})
	require.NoError(t, err)
	require.Equal(t, "both", route.Node.UUID)
	readBanner(t, c)
	c.Close()

	// A tunnel-only node was never dialed directly, nor anything else.
	require.Empty(t, dialer.addrs())
}

// TestDialHostTunnelNodeWithoutTunnelServer: a proxy without a tunnel
// server never dials a tunnel node: it is offline at once.
func TestDialHostTunnelNodeWithoutTunnelServer(t *testing.T) {
	dialer := &recordingDialer{}
	env := newRouterEnv(t, []services.Node{{UUID: "tn", Hostname: "natted", Cluster: testCluster, Tunnel: true}}, dialer)
	_, _, err := env.router.DialHost(context.Background(), RouteRequest{Target: Target{Host: "natted"}})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.ErrorContains(t, err, `node "natted" is offline`)
	require.Empty(t, dialer.addrs())
}
