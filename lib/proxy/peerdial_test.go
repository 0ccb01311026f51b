package proxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/proxy/peer"
	"github.com/postern-dev/postern/lib/services"
)

// x509CA issues proxy identities the way auth does (CN=uuid, O=proxy,
// OU=cluster, client-auth only), for the peer port.
type x509CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newX509CA(t *testing.T) *x509CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: testCluster},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &x509CA{cert: cert, key: key, pool: pool}
}

func (ca *x509CA) proxyIdentity(t *testing.T, uuid string) peer.Identity {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:   pkix.Name{CommonName: uuid, Organization: []string{peer.RoleProxy}, OrganizationalUnit: []string{testCluster}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return peer.Identity{UUID: uuid, ClusterName: testCluster,
		Certificate: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		CAPool:      func() *x509.CertPool { return ca.pool }}
}

// peeredEnv: proxy A holds the tunnels (a real tunnel server and a real
// peer server on loopback); the Router under test is proxy B's, with its
// own (empty) tunnel server and a peer client fed by a real TunnelLocator
// over the backend.
type peeredEnv struct {
	*routerEnv
	a        *tunnelEnv
	b        *tunnelEnv
	peerAddr string
	leases   *services.Store
}

func newPeeredEnv(t *testing.T, nodes []services.Node, routerClock *clockwork.FakeClock) *peeredEnv {
	t.Helper()
	ca := newX509CA(t)
	a, b := newTunnelEnv(t), newTunnelEnv(t)
	srv, err := peer.NewServer(peer.ServerConfig{Identity: ca.proxyIdentity(t, "proxy-a"), Tunnels: a.srv})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	e := &peeredEnv{a: a, b: b, peerAddr: ln.Addr().String()}
	e.routerEnv = newRouterEnvWith(t, nodes, func(c *RouterConfig) {
		c.Dialer = &recordingDialer{}
		c.Tunnels = b.srv
		c.Clock = routerClock
	})
	e.leases = e.routerEnv.store
	loc, err := services.NewTunnelLocator(services.TunnelLocatorConfig{Events: e.leases, Clock: clockwork.NewFakeClockAt(t0)})
	require.NoError(t, err)
	t.Cleanup(func() { loc.Close() })
	require.NoError(t, loc.WaitSynced(context.Background()))
	pc, err := peer.NewClient(peer.ClientConfig{Identity: ca.proxyIdentity(t, "proxy-b"), Locator: loc})
	require.NoError(t, err)
	t.Cleanup(func() { pc.Close() })
	// The Router is rebuilt with the peer client (RouterConfig is by value).
	cfg := e.router.cfg
	cfg.Peers = pc
	e.router, err = NewRouter(cfg)
	require.NoError(t, err)
	return e
}

// lease writes proxy's tunnel_connection for node, as auth would.
func (e *peeredEnv) lease(t *testing.T, node, proxy, addr string) {
	t.Helper()
	require.NoError(t, e.leases.UpsertTunnelConnection(context.Background(), services.TunnelConnection{
		NodeUUID: node, ProxyUUID: proxy, PeerAddr: addr, LastSeen: t0, Expires: t0.Add(time.Hour),
	}))
}

func (e *peeredEnv) waitLeases(t *testing.T, node string, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := e.router.cfg.Peers.PeerLocated(node)
		if len(e.router.cfg.Peers.PeerHolders(node)) >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no lease for %s", node)
		}
	}
}

// TestDialHostThroughPeer: a tunnel node whose only tunnel is on proxy A
// is reached from proxy B's Router through A's peer server; a stale lease
// naming a proxy that holds nothing loses to the real one in the parallel
// dial; `pctl route` says "via peer".
func TestDialHostThroughPeer(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClockAt(t0)
	env := newPeeredEnv(t, []services.Node{{UUID: "tn", Hostname: "natted", Cluster: testCluster, Tunnel: true}}, clock)
	env.a.startAgent(t, "tn")
	reg := env.a.srv.TunnelRegistered("tn")
	if !env.a.srv.HasTunnel("tn") {
		<-reg
	}
	env.lease(t, "tn", "proxy-a", env.peerAddr)
	// A stale lease: proxy-b itself is never a candidate, and a peer
	// that answers "no tunnel here" just loses.
	env.lease(t, "tn", "proxy-b", "127.0.0.1:1")
	// And a lease naming proxy-c at an address where proxy-a answers:
	// refused for its certificate, while proxy-a wins in parallel.
	env.lease(t, "tn", "proxy-c", env.peerAddr)
	env.waitLeases(t, "tn", 2)
	require.ElementsMatch(t, []string{"proxy-a", "proxy-c"}, env.router.cfg.Peers.PeerHolders("tn"))

	c, route, err := env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "natted"}, Source: "198.51.100.1:4000"})
	require.NoError(t, err)
	require.Equal(t, "tn", route.Node.UUID)
	readBanner(t, c)
	c.Close()
	require.Contains(t, env.router.ExplainTarget(ctx, Target{Host: "natted"}).String(), "via:        via peer proxy-")
	require.Empty(t, env.router.cfg.Dialer.(*recordingDialer).addrs(), "a tunnel-only node is never dialed directly")
}

// TestDialHostPeerFindTimeout: the find timeout covers peers too: a dial
// waiting for a tunnel-only node succeeds when a peer reports a tunnel
// (within tunnel_find_timeout on the Router's clock), and one for a node
// only stale leases name gives up at the timeout with the peer's answer.
func TestDialHostPeerFindTimeout(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClockAt(t0)
	env := newPeeredEnv(t, []services.Node{
		{UUID: "tn", Hostname: "natted", Cluster: testCluster, Tunnel: true},
		{UUID: "gone", Hostname: "gone", Cluster: testCluster, Tunnel: true},
	}, clock)
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	res := env.dialAsync(ctx, "natted")
	require.NoError(t, clock.BlockUntilContext(waitCtx, 1), "the dial waits on the find timer")
	clock.Advance(4 * time.Second)
	env.a.startAgent(t, "tn")
	reg := env.a.srv.TunnelRegistered("tn")
	if !env.a.srv.HasTunnel("tn") {
		<-reg
	}
	env.lease(t, "tn", "proxy-a", env.peerAddr)
	r := <-res
	require.NoError(t, r.err)
	readBanner(t, r.conn)
	r.conn.Close()

	// A lease whose proxy holds no tunnel from the node: the peer answers
	// at once (no loop, no wait there); we wait here until the timeout.
	env.lease(t, "gone", "proxy-a", env.peerAddr)
	env.waitLeases(t, "gone", 1)
	res = env.dialAsync(ctx, "gone")
	require.NoError(t, clock.BlockUntilContext(waitCtx, 1))
	clock.Advance(5 * time.Second)
	r = <-res
	require.True(t, trace.IsConnectionProblem(r.err), "%v", r.err)
	require.ErrorContains(t, r.err, `node "gone" is offline: no tunnel reached this proxy within 5s (peers: `)
	require.ErrorContains(t, r.err, `proxy "proxy-a" holds no tunnel from node "gone"`)
}

// dyingTunnels is a tunnel server whose tunnel from every node is still
// registered but fails every dial, as one does in the instant between its
// connection dying and its removal.
type dyingTunnels struct{ TunnelDialer }

func (dyingTunnels) HasTunnel(string) bool { return true }

func (dyingTunnels) DialTunnel(_ context.Context, uuid, _, _ string) (net.Conn, error) {
	return nil, trace.ConnectionProblem(io.EOF, "opening a channel on the tunnel from node %q: EOF", uuid)
}

// TestDialHostPeerWhenTheLocalTunnelDies: a local tunnel that fails under
// the dial (a rolling restart: the node is moving) is not the end when a
// peer holds another tunnel from the node: the session goes through it.
func TestDialHostPeerWhenTheLocalTunnelDies(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClockAt(t0)
	env := newPeeredEnv(t, []services.Node{{UUID: "tn", Hostname: "natted", Cluster: testCluster, Tunnel: true}}, clock)
	env.a.startAgent(t, "tn")
	reg := env.a.srv.TunnelRegistered("tn")
	if !env.a.srv.HasTunnel("tn") {
		<-reg
	}
	cfg := env.router.cfg
	cfg.Tunnels = dyingTunnels{cfg.Tunnels}
	router, err := NewRouter(cfg)
	require.NoError(t, err)

	// No peer: the local failure is the answer.
	_, _, err = router.DialHost(ctx, RouteRequest{Target: Target{Host: "natted"}})
	require.ErrorContains(t, err, "opening a channel on the tunnel")

	env.lease(t, "tn", "proxy-a", env.peerAddr)
	env.waitLeases(t, "tn", 1)
	c, route, err := router.DialHost(ctx, RouteRequest{Target: Target{Host: "natted"}})
	require.NoError(t, err)
	require.Equal(t, "tn", route.Node.UUID)
	readBanner(t, c)
	c.Close()
}
