package peer

import (
	"bytes"
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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testCluster = "peer-test"

// testCA issues X.509 identities the way auth does (CN=id, O=role,
// OU=cluster, client-auth usage only).
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: testCluster, Organization: []string{testCluster}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(t *testing.T, id, role, cluster string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: id, Organization: []string{role}, OrganizationalUnit: []string{cluster}},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func (ca *testCA) identity(t *testing.T, id, role string) Identity {
	return Identity{UUID: id, ClusterName: testCluster, Certificate: ca.issue(t, id, role, testCluster), CAPool: func() *x509.CertPool { return ca.pool }}
}

// echoTunnels holds tunnels from the nodes it lists; each "node" is a
// loopback TCP server that sends an SSH banner, echoes until EOF, then
// writes "done" and closes: half-close through the peer shows as "...done".
type echoTunnels struct {
	nodes map[string]bool
	ln    net.Listener
	dials atomic.Int32
	wg    sync.WaitGroup
	mu    sync.Mutex
	last  DialRequest
	// lastMeta is what the last dial's context would send on.
	lastMeta observe.DialMeta
}

func newEchoTunnels(t *testing.T, nodes ...string) *echoTunnels {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e := &echoTunnels{nodes: map[string]bool{}, ln: ln}
	for _, n := range nodes {
		e.nodes[n] = true
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				_, _ = c.Write([]byte("SSH-2.0-node\r\n"))
				_, _ = io.Copy(c, c)
				_, _ = c.Write([]byte("done"))
			}()
		}
	}()
	return e
}

func (e *echoTunnels) close() {
	e.ln.Close()
	e.wg.Wait()
}

func (e *echoTunnels) HasTunnel(uuid string) bool { return e.nodes[uuid] }

func (e *echoTunnels) DialTunnel(ctx context.Context, uuid, source, destination string) (net.Conn, error) {
	if !e.nodes[uuid] {
		return nil, trace.NotFound("no tunnel from %q", uuid)
	}
	e.dials.Add(1)
	e.mu.Lock()
	e.last = DialRequest{NodeUUID: uuid, Source: source, Destination: destination}
	e.lastMeta = observe.MetaFromContext(ctx)
	e.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, "tcp", e.ln.Addr().String())
}

type staticLocator struct {
	mu     sync.Mutex
	leases []services.TunnelConnection
}

func (l *staticLocator) Holders(node, exclude string) []services.TunnelConnection {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []services.TunnelConnection
	for _, tc := range l.leases {
		if tc.NodeUUID == node && tc.ProxyUUID != exclude {
			out = append(out, tc)
		}
	}
	return out
}

func (l *staticLocator) Located(string) <-chan struct{} { return make(chan struct{}) }

type peerEnv struct {
	ca      *testCA
	srv     *Server
	addr    string
	tunnels *echoTunnels
	audit   *events.Recorder
}

func newPeerEnv(t *testing.T, serverID string, nodes ...string) *peerEnv {
	t.Helper()
	return newPeerEnvWithClock(t, nil, serverID, nodes...)
}

// newPeerEnvWithClock is newPeerEnv with the server on clock (nil: real).
func newPeerEnvWithClock(t *testing.T, clock clockwork.Clock, serverID string, nodes ...string) *peerEnv {
	t.Helper()
	ca := newTestCA(t)
	tun := newEchoTunnels(t, nodes...)
	rec := events.NewRecorder()
	srv, err := NewServer(ServerConfig{Identity: ca.identity(t, serverID, RoleProxy), Tunnels: tun, HandshakeTimeout: 5 * time.Second, Deps: observe.Deps{Audit: rec, Clock: clock}})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-served, ErrServerClosed)
		tun.close()
	})
	return &peerEnv{ca: ca, srv: srv, addr: ln.Addr().String(), tunnels: tun, audit: rec}
}

func (e *peerEnv) client(t *testing.T, id Identity, leases ...services.TunnelConnection) (*Client, *events.Recorder) {
	t.Helper()
	rec := events.NewRecorder()
	c, err := NewClient(ClientConfig{Identity: id, Locator: &staticLocator{leases: leases}, DialTimeout: 5 * time.Second, Deps: observe.Deps{Audit: rec}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, rec
}

func lease(node, proxy, addr string) services.TunnelConnection {
	return services.TunnelConnection{NodeUUID: node, ProxyUUID: proxy, PeerAddr: addr, Expires: time.Now().Add(time.Hour)}
}

func waitAudit(t *testing.T, rec *events.Recorder, match func(events.Event) bool) events.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := rec.Wait(ctx, events.AccessDenied, match)
	require.NoError(t, err)
	return e
}

func reasonHas(s string) func(events.Event) bool {
	return func(e events.Event) bool {
		r, _ := e.Fields[events.FieldReason].(string)
		return e.Fields[events.FieldKind] == "peer" && strings.Contains(r, s)
	}
}

// TestPeerDial: a dial through the peer reaches the node over the peer's
// tunnel with source and destination passed on, bytes flow both ways, and
// half-close is honoured (the node answers after our EOF).
func TestPeerDial(t *testing.T) {
	env := newPeerEnv(t, "proxy-a", "n1")
	c, _ := env.client(t, env.ca.identity(t, "proxy-b", RoleProxy), lease("n1", "proxy-a", env.addr))
	require.Equal(t, []string{"proxy-a"}, c.PeerHolders("n1"))

	conn, err := c.DialPeer(context.Background(), "proxy-a", "n1", "198.51.100.7:5000", "n1:22")
	require.NoError(t, err)
	defer conn.Close()
	banner := make([]byte, len("SSH-2.0-node\r\n"))
	_, err = io.ReadFull(conn, banner)
	require.NoError(t, err)
	require.Equal(t, "SSH-2.0-node\r\n", string(banner))
	_, err = conn.Write([]byte("abc"))
	require.NoError(t, err)
	require.NoError(t, conn.(interface{ CloseWrite() error }).CloseWrite())
	rest, err := io.ReadAll(conn)
	require.NoError(t, err)
	require.Equal(t, "abcdone", string(rest))
	env.tunnels.mu.Lock()
	require.Equal(t, DialRequest{NodeUUID: "n1", Source: "198.51.100.7:5000", Destination: "n1:22"}, env.tunnels.last)
	env.tunnels.mu.Unlock()
}

// TestPeerOneConnectionManyDials: any number of concurrent dials share
// one TLS connection to the peer.
func TestPeerOneConnectionManyDials(t *testing.T) {
	env := newPeerEnv(t, "proxy-a", "n1")
	c, _ := env.client(t, env.ca.identity(t, "proxy-b", RoleProxy), lease("n1", "proxy-a", env.addr))
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := c.DialPeer(context.Background(), "proxy-a", "n1", "", "")
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			msg := []byte{byte('a' + i)}
			buf := make([]byte, len("SSH-2.0-node\r\n")+1)
			if _, err := conn.Write(msg); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadFull(conn, buf); err != nil {
				errs <- err
				return
			}
			if !bytes.HasSuffix(buf, msg) {
				errs <- trace.BadParameter("dial %d got %q", i, buf)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, n, env.tunnels.dials.Load())
	env.srv.mu.Lock()
	sessions := len(env.srv.sessions)
	env.srv.mu.Unlock()
	require.Equal(t, 1, sessions, "one connection per pair of proxies")
}

// TestPeerUnheldNode: a dial for a node the peer holds no tunnel from
// fails at once with a clear error, is not routed anywhere (no tunnel
// dial at all), and is audited.
func TestPeerUnheldNode(t *testing.T) {
	env := newPeerEnv(t, "proxy-a", "n1")
	c, _ := env.client(t, env.ca.identity(t, "proxy-b", RoleProxy), lease("n2", "proxy-a", env.addr))
	start := time.Now()
	_, err := c.DialPeer(context.Background(), "proxy-a", "n2", "", "")
	require.True(t, trace.IsNotFound(err), "%v", err)
	require.Contains(t, err.Error(), `proxy "proxy-a" holds no tunnel from node "n2"`)
	require.Less(t, time.Since(start), 2*time.Second)
	require.Zero(t, env.tunnels.dials.Load())
	e := waitAudit(t, env.audit, reasonHas(`holds no tunnel from node "n2"`))
	require.Equal(t, "proxy-b", e.Fields[events.FieldServerID])
	require.Equal(t, "n2", e.Fields[events.FieldTarget])
}

// TestPeerRefusesNodeCertificate is the attack of a node (or anything
// holding a node's identity) on the peer port: its own certificate of the
// same CA gets it nothing, and the attempt is audited.
func TestPeerRefusesNodeCertificate(t *testing.T) {
	env := newPeerEnv(t, "proxy-a", "n1")
	c, _ := env.client(t, env.ca.identity(t, "node-1", "node"), lease("n1", "proxy-a", env.addr))
	_, err := c.DialPeer(context.Background(), "proxy-a", "n1", "", "")
	require.Error(t, err)
	e := waitAudit(t, env.audit, reasonHas(`has role "node", only "proxy" may peer`))
	require.Equal(t, "node-1", e.Fields[events.FieldServerID])
	require.Zero(t, env.tunnels.dials.Load())

	// A proxy certificate of another cluster's CA is refused too.
	// (The attacker trusts our CA, so that it is the server that decides.)
	other := newTestCA(t)
	forged := other.identity(t, "proxy-x", RoleProxy)
	forged.CAPool = func() *x509.CertPool { return env.ca.pool }
	c2, _ := env.client(t, forged, lease("n1", "proxy-a", env.addr))
	_, err = c2.DialPeer(context.Background(), "proxy-a", "n1", "", "")
	require.Error(t, err)
	waitAudit(t, env.audit, reasonHas(`"proxy-x" is not a valid identity of this cluster`))
	require.Zero(t, env.tunnels.dials.Load())
}

// TestPeerWrongUUID: the lease says proxy-c holds the tunnel, but the
// process at its address presents proxy-a's certificate (a proxy that
// wrote a lease pointing at another, or an address taken over): the
// dialer refuses before sending anything, and audits it.
func TestPeerWrongUUID(t *testing.T) {
	env := newPeerEnv(t, "proxy-a", "n1")
	c, rec := env.client(t, env.ca.identity(t, "proxy-b", RoleProxy), lease("n1", "proxy-c", env.addr))
	_, err := c.DialPeer(context.Background(), "proxy-c", "n1", "", "")
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.Contains(t, err.Error(), `presented the certificate of proxy "proxy-a", expected proxy "proxy-c"`)
	e := waitAudit(t, rec, reasonHas(`expected proxy "proxy-c"`))
	require.Equal(t, "proxy-c", e.Fields[events.FieldServerID])
	require.Zero(t, env.tunnels.dials.Load())
}

// TestPeerGarbage: garbage instead of TLS, and garbage instead of a dial
// request on an authenticated stream, are refused, audited, and leave the
// server serving.
func TestPeerGarbage(t *testing.T) {
	env := newPeerEnv(t, "proxy-a", "n1")
	nc, err := net.Dial("tcp", env.addr)
	require.NoError(t, err)
	_, _ = nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.ReadAll(nc)
	nc.Close()
	waitAudit(t, env.audit, reasonHas("peer TLS handshake failed"))

	c, _ := env.client(t, env.ca.identity(t, "proxy-b", RoleProxy), lease("n1", "proxy-a", env.addr))
	sess, err := c.session(context.Background(), "proxy-a", env.addr)
	require.NoError(t, err)
	for _, bad := range [][]byte{
		{0x00, 0x05, 'h', 'e', 'l', 'l', 'o'},
		{0xff, 0xff},
		append([]byte{0x00, 0x10}, []byte(`{"node_uuid":"a/b"}`)[:16]...),
		append([]byte{0x00, byte(len(`{"node_uuid":"n1","x":1}`))}, []byte(`{"node_uuid":"n1","x":1}`)...),
	} {
		st, err := sess.OpenStream()
		require.NoError(t, err)
		_, err = st.Write(bad)
		require.NoError(t, err)
		var resp DialResponse
		require.NoError(t, readFrame(st, &resp))
		require.Equal(t, kindBadParameter, resp.Kind, "%q: %+v", bad, resp)
		st.Close()
	}
	waitAudit(t, env.audit, reasonHas("peer frame"))
	require.Zero(t, env.tunnels.dials.Load())

	// Still serving.
	conn, err := c.DialPeer(context.Background(), "proxy-a", "n1", "", "")
	require.NoError(t, err)
	conn.Close()
}

// TestPeerShutdownDrains: Shutdown refuses new dials but lets an open one
// finish.
func TestPeerShutdownDrains(t *testing.T) {
	env := newPeerEnv(t, "proxy-a", "n1")
	c, _ := env.client(t, env.ca.identity(t, "proxy-b", RoleProxy), lease("n1", "proxy-a", env.addr))
	conn, err := c.DialPeer(context.Background(), "proxy-a", "n1", "", "")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- env.srv.Shutdown(context.Background()) }()
	// The open dial still works...
	_, err = conn.Write([]byte("x"))
	require.NoError(t, err)
	buf := make([]byte, len("SSH-2.0-node\r\nx"))
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned with a dial open: %v", err)
	default:
	}
	// ...and Shutdown returns once it ends.
	require.NoError(t, conn.(interface{ CloseWrite() error }).CloseWrite())
	_, _ = io.ReadAll(conn)
	conn.Close()
	require.NoError(t, <-done)
}
