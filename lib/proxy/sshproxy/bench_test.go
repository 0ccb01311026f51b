package sshproxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/user"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/reversetunnel"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

const benchCluster = "bench"

// jumpChain is one `ssh -J` path in one process: a proxy SSH server (the
// sshproxy Handler over a Router), a reverse tunnel server, and a node
// whose only way in is its tunnel (an agent handing each transport to the
// node's SSH server). Every component is the production one.
type jumpChain struct {
	proxyAddr string
	client    *ssh.ClientConfig
	nodeCfg   *ssh.ClientConfig
}

// benchTracer is what the chain's components trace with: a name for the
// arm, and the tracer each component takes (nil: tracing off).
type benchTracer struct {
	name string
	tp   tracerProvider
}

func newJumpChain(b *testing.B, tr benchTracer) *jumpChain {
	b.Helper()
	me, err := user.Current()
	require.NoError(b, err)
	log := logrus.New()
	log.SetOutput(io.Discard)
	clock := clockwork.NewRealClock()
	userCA, hostCA := srvtest.NewCA(b), srvtest.NewCA(b)
	ap := srvtest.NewAccessPoint()
	ap.SetCA(userCA.CertAuthority(benchCluster, services.UserCA))
	ap.SetCA(hostCA.CertAuthority(benchCluster, services.HostCA))
	ap.UpsertRole(srvtest.AccessRole())

	node := services.Node{UUID: "00000000-0000-4000-8000-00000000000a", Hostname: "tn", Cluster: benchCluster, Tunnel: true,
		LastHeartbeat: time.Now(), Expires: time.Now().Add(time.Hour)}
	nodeSrv, err := srv.New(nodeSrvConfig(srv.Config{
		ClusterName: benchCluster,
		HostSigners: []ssh.Signer{hostCA.HostSigner(b, node.UUID, "tn")},
		AccessPoint: ap,
		GetNode:     func() services.Node { return node },
	}, clock, log.WithField("component", "node"), tr.tp, "node"))
	require.NoError(b, err)
	b.Cleanup(func() { nodeSrv.Close() })

	tun, err := reversetunnel.NewServer(tunnelServerConfig(reversetunnel.ServerConfig{
		HostSigner: hostCA.RoleHostSigner(b, srvtest.HostCert{UUID: "proxy", Role: reversetunnel.RoleProxy, Principals: []string{"127.0.0.1"}}),
		HostCAs:    func() []ssh.PublicKey { return []ssh.PublicKey{hostCA.Signer.PublicKey()} },
	}, clock, log.WithField("component", "tunnel"), tr.tp))
	require.NoError(b, err)
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = tun.Serve(tln) }()
	b.Cleanup(func() { tun.Close() })
	agent, err := reversetunnel.NewAgent(agentConfig(reversetunnel.AgentConfig{
		ProxyAddr: tln.Addr().String(),
		Signer:    hostCA.RoleHostSigner(b, srvtest.HostCert{UUID: node.UUID, Role: reversetunnel.RoleNode}),
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{hostCA.Signer.PublicKey()} },
		Handler:   nodeSrv.HandleConn,
	}, clock, log.WithField("component", "agent")))
	require.NoError(b, err)
	agent.Start()
	b.Cleanup(func() { agent.Close() })
	reg := tun.TunnelRegistered(node.UUID)
	if !tun.HasTunnel(node.UUID) {
		select {
		case <-reg:
		case <-time.After(10 * time.Second):
			b.Fatal("no tunnel")
		}
	}

	bk, err := memory.New(memory.Config{})
	require.NoError(b, err)
	b.Cleanup(func() { bk.Close() })
	store := services.NewStore(bk)
	ctx := context.Background()
	require.NoError(b, store.SetClusterNetworkingConfig(ctx, services.DefaultClusterNetworkingConfig()))
	require.NoError(b, store.UpsertNode(ctx, node))
	nw, err := services.NewNodeWatcher(services.NodeWatcherConfig{Events: store.NodeEvents()})
	require.NoError(b, err)
	b.Cleanup(func() { nw.Close() })
	require.NoError(b, nw.WaitSynced(ctx))
	router, err := proxy.NewRouter(routerConfig(proxy.RouterConfig{ClusterName: benchCluster, NodeWatcher: nw, Networking: store, Tunnels: tun},
		clock, log.WithField("component", "router"), tr.tp))
	require.NoError(b, err)
	h, err := New(handlerConfig(Config{Router: router}, log.WithField("component", "proxy:ssh")))
	require.NoError(b, err)
	proxySrv, err := srv.New(nodeSrvConfig(srv.Config{
		ClusterName: benchCluster,
		HostSigners: []ssh.Signer{hostCA.HostSigner(b, "proxy", "127.0.0.1")},
		AccessPoint: ap,
		Proxy:       h,
	}, clock, log.WithField("component", "proxy:ssh"), tr.tp, "proxy"))
	require.NoError(b, err)
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = proxySrv.Serve(pln) }()
	b.Cleanup(func() { proxySrv.Close() })

	signer := userCA.UserSigner(b, srvtest.UserCert{User: "alice", Logins: []string{me.Username}, Cluster: benchCluster})
	cfg := func() *ssh.ClientConfig {
		cc := &ssh.ClientConfig{User: me.Username, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
			HostKeyCallback: hostCA.HostKeyCallback(), Timeout: 10 * time.Second}
		cc.Ciphers = []string{"aes128-gcm@openssh.com"}
		return cc
	}
	return &jumpChain{proxyAddr: pln.Addr().String(), client: cfg(), nodeCfg: cfg()}
}

// jump is one `ssh -J proxy tn` connection set-up: the proxy handshake,
// a direct-tcpip channel routed over the tunnel, the node's handshake
// through it; then both close.
func (c *jumpChain) jump(b *testing.B) {
	pc, err := ssh.Dial("tcp", c.proxyAddr, c.client)
	require.NoError(b, err)
	defer pc.Close()
	ch, err := pc.Dial("tcp", "tn:22")
	require.NoError(b, err)
	conn, chans, reqs, err := ssh.NewClientConn(ch, "tn:22", c.nodeCfg)
	require.NoError(b, err)
	nc := ssh.NewClient(conn, chans, reqs)
	require.NoError(b, nc.Close())
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkJumpSetupTracing: the process CPU (every hop, and the client)
// per `ssh -J` set-up through a tunnel node, with tracing off and with
// every connection traced (sampling 1.0, batched to an OTLP/HTTP
// collector on loopback), arms side by side in one run. Read cpu-ms/op.
func BenchmarkJumpSetupTracing(b *testing.B) {
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	// Cleanups run last-registered first: the tracer provider (benchArms)
	// flushes before the collector goes.
	b.Cleanup(collector.Close)
	for _, arm := range benchArms(b, strings.TrimPrefix(collector.URL, "http://")) {
		b.Run(arm.name, func(b *testing.B) {
			c := newJumpChain(b, arm)
			c.jump(b) // warm up: first-use allocations, the tunnel's data connection
			b.ResetTimer()
			start := cpuTime()
			for range b.N {
				c.jump(b)
			}
			b.ReportMetric(float64((cpuTime()-start).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}
