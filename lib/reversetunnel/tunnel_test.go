package reversetunnel

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	ca    *srvtest.CA
	srv   *Server
	addr  string
	audit *events.Recorder
}

func newFixture(t *testing.T, clock clockwork.Clock, opts ...func(*ServerConfig)) *fixture {
	t.Helper()
	ca := srvtest.NewCA(t)
	audit := events.NewRecorder()
	cfg := ServerConfig{
		HostSigner: ca.RoleHostSigner(t, srvtest.HostCert{UUID: "proxy-1", Role: RoleProxy, Principals: []string{"127.0.0.1"}}),
		HostCAs:    func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey()} },
		Deps:       observe.Deps{Audit: audit, Clock: clock},
	}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := NewServer(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		require.ErrorIs(t, <-done, ErrServerClosed)
	})
	return &fixture{ca: ca, srv: s, addr: ln.Addr().String(), audit: audit}
}

// echoHandler stands in for the node's SSH server: it reports the
// connection's remote address, then echoes.
func echoHandler(remotes chan<- string) ConnHandler {
	return func(nc net.Conn) {
		remotes <- nc.RemoteAddr().String()
		_, _ = io.Copy(nc, nc)
		_ = nc.Close()
	}
}

func (f *fixture) startAgent(t *testing.T, signer ssh.Signer, h ConnHandler, reg prometheus.Registerer) *Agent {
	t.Helper()
	a, err := NewAgent(AgentConfig{
		ProxyAddr: f.addr,
		Signer:    signer,
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{f.ca.Signer.PublicKey()} },
		Handler:   h,
		Deps:      observe.Deps{Metrics: reg},
	})
	require.NoError(t, err)
	a.Start()
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

func waitTunnel(t *testing.T, s *Server, uuid string) {
	t.Helper()
	ch := s.TunnelRegistered(uuid)
	if s.HasTunnel(uuid) {
		return
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no tunnel from %s registered", uuid)
	}
}

// TestTunnelCarriesConnections: an agent with a node certificate is
// registered under the certificate's UUID, and a dial over it reaches the
// node's handler with the client's source address.
func TestTunnelCarriesConnections(t *testing.T) {
	f := newFixture(t, nil)
	remotes := make(chan string, 1)
	f.startAgent(t, f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}), echoHandler(remotes), nil)
	waitTunnel(t, f.srv, "node-1")

	conn, err := f.srv.DialTunnel(context.Background(), "node-1", "203.0.113.7:5555", "web:22")
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "203.0.113.7:5555", <-remotes)
	_, err = conn.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))

	_, err = f.srv.DialTunnel(context.Background(), "node-2", "", "")
	require.Error(t, err, "no tunnel from node-2")
}

// TestTunnelReconnects: a dropped tunnel is unregistered and the agent
// comes back by itself, counted in postern_tunnel_reconnects_total.
func TestTunnelReconnects(t *testing.T) {
	f := newFixture(t, nil)
	reg := prometheus.NewRegistry()
	remotes := make(chan string, 4)
	a := f.startAgent(t, f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}), echoHandler(remotes), reg)
	waitTunnel(t, f.srv, "node-1")
	// The server registers before the agent's handshake has returned:
	// wait for the agent's side too, or there is nothing to drop yet.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, a.WaitConnected(ctx))
	again := f.srv.TunnelRegistered("node-1")
	a.DropTunnel()
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not reconnect")
	}
	require.Equal(t, 1.0, testutil.ToFloat64(a.reconnects))
	conn, err := f.srv.DialTunnel(context.Background(), "node-1", "1.2.3.4:1", "x")
	require.NoError(t, err)
	conn.Close()
}

// dialRaw performs the attack: a real x/crypto client offering signer to
// the tunnel port. It returns the handshake error.
func dialRaw(t *testing.T, addr string, signer ssh.Signer) error {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	c, chans, reqs, err := ssh.NewClientConn(nc, addr, &ssh.ClientConfig{
		User:            "tunnel",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	if err == nil {
		go ssh.DiscardRequests(reqs)
		go func() {
			for range chans {
			}
		}()
		c.Close()
	}
	return err
}

// TestTunnelRefusals: everything but a valid node certificate of this
// cluster is refused at the handshake, registers nothing, and is audited.
func TestTunnelRefusals(t *testing.T) {
	f := newFixture(t, nil)
	other := srvtest.NewCA(t)
	cases := []struct {
		name   string
		signer ssh.Signer
		reason string
	}{
		{"user certificate", f.ca.UserSigner(t, srvtest.UserCert{User: "node-1", Logins: []string{"node-1"}}), "user certificate"},
		{"other cluster's host cert", other.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}), "not signed by a trusted host CA"},
		{"expired", f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode, ValidBefore: time.Now().Add(-time.Hour)}), "expired"},
		{"proxy certificate", f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleProxy}), `role "proxy"`},
		{"no role (old certificate)", f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1"}), `role ""`},
		{"plain key", srvtest.NewSigner(t), "plain"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := len(f.audit.Events())
			require.Error(t, dialRaw(t, f.addr, tc.signer))
			require.False(t, f.srv.HasTunnel("node-1"))
			evs := f.audit.Events()[n:]
			require.Len(t, evs, 1)
			require.Equal(t, events.AccessDenied, evs[0].Type)
			require.Equal(t, "tunnel", evs[0].Fields[events.FieldKind])
			require.Contains(t, evs[0].Fields[events.FieldReason], tc.reason)
		})
	}
	t.Run("garbage bytes", func(t *testing.T) {
		n := len(f.audit.Events())
		nc, err := net.Dial("tcp", f.addr)
		require.NoError(t, err)
		_, err = nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		require.NoError(t, err)
		require.NoError(t, nc.(*net.TCPConn).CloseWrite())
		_, _ = io.Copy(io.Discard, nc) // the server hangs up
		nc.Close()
		ev, err := f.audit.Wait(context.Background(), events.AccessDenied, func(e events.Event) bool {
			r, _ := e.Fields[events.FieldReason].(string)
			return strings.Contains(r, "handshake failed")
		})
		require.NoError(t, err)
		require.Equal(t, "tunnel", ev.Fields[events.FieldKind])
		require.Len(t, f.audit.Events(), n+1)
	})
}

// TestAgentRefusesNonProxy: a tunnel server presenting a node's host
// certificate (a node posing as the proxy) never gets the agent's
// channels: the agent refuses it and retries.
func TestAgentRefusesNonProxy(t *testing.T) {
	ca := srvtest.NewCA(t)
	clock := clockwork.NewFakeClock()
	s, err := NewServer(ServerConfig{
		HostSigner: ca.RoleHostSigner(t, srvtest.HostCert{UUID: "evil", Role: RoleNode, Principals: []string{"127.0.0.1"}}),
		HostCAs:    func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey()} },
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(ln) }()
	defer s.Close()
	a, err := NewAgent(AgentConfig{
		ProxyAddr: ln.Addr().String(),
		Signer:    ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}),
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey()} },
		Handler:   func(nc net.Conn) { t.Error("served a channel from a non-proxy"); nc.Close() },
		Deps:      observe.Deps{Clock: clock},
	})
	require.NoError(t, err)
	a.Start()
	defer a.Close()
	// The agent failed its first handshake and waits to retry.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.False(t, s.HasTunnel("node-1"))
}

// TestTunnelKeepAliveDropsSilentPeer: a peer that stops answering
// keep-alives is dropped after KeepAliveCountMax missed intervals.
func TestTunnelKeepAliveDropsSilentPeer(t *testing.T) {
	clock := clockwork.NewFakeClock()
	f := newFixture(t, clock)
	signer := f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode})
	nc, err := net.Dial("tcp", f.addr)
	require.NoError(t, err)
	defer nc.Close()
	registered := f.srv.TunnelRegistered("node-1")
	c, chans, _, err := ssh.NewClientConn(nc, f.addr, &ssh.ClientConfig{
		User: "tunnel", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	require.NoError(t, err)
	go func() {
		for range chans {
		}
	}()
	// Global requests are never answered: this peer is "half-open".
	<-registered
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The first advance sends the probe; it goes unanswered for
	// DefaultKeepAliveCountMax intervals counted from the last answer
	// (here: the tunnel's start), the probe's own interval included.
	for i := 0; i < DefaultKeepAliveCountMax; i++ {
		require.NoError(t, clock.BlockUntilContext(ctx, 1))
		clock.Advance(DefaultKeepAliveInterval)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- c.Wait() }()
	select {
	case <-waitErr:
	case <-ctx.Done():
		t.Fatal("the server kept a silent tunnel")
	}
	// Closed (and unregistering): nothing can be dialed over it.
	_, err = f.srv.DialTunnel(context.Background(), "node-1", "", "")
	require.Error(t, err)
}

// TestTunnelAuthChannel: a node's ChannelAuth is spliced to the auth API
// (here an echo server); any other channel a node opens is refused.
func TestTunnelAuthChannel(t *testing.T) {
	authLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer authLn.Close()
	go func() {
		for {
			c, err := authLn.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	f := newFixture(t, nil, func(c *ServerConfig) {
		c.DialAuth = func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", authLn.Addr().String())
		}
	})
	a := f.startAgent(t, f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}), echoHandler(make(chan string, 1)), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, a.WaitConnected(ctx))
	c, err := a.DialAuth(ctx, "tcp", "auth")
	require.NoError(t, err)
	_, err = c.Write([]byte("hello"))
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf))
	c.Close()

	a.mu.Lock()
	conn := a.conn
	a.mu.Unlock()
	_, _, err = conn.OpenChannel("direct-tcpip", nil)
	require.Error(t, err)
	_, _, err = conn.OpenChannel(ChannelTransport, nil)
	require.Error(t, err, "a node cannot open transport channels on the proxy")
}

// TestTransportConnAddrs: a transport channel's ends are TCP addresses
// when the proxy names an IP:port (the node's SSH server derives
// SSH_CLIENT and SSH_CONNECTION from *net.TCPAddr ends, as for a direct
// node), with this node's end of the tunnel as the local end; anything
// else stays an opaque name.
func TestTransportConnAddrs(t *testing.T) {
	tunnelLocal := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 40000}
	for _, tc := range []struct {
		source, wantRemote string
		tcp                bool
	}{
		{"203.0.113.7:5555", "203.0.113.7:5555", true},
		{"[2001:db8::1]:22", "[2001:db8::1]:22", true},
		{"", "tunnel", false},
		{"not-an-address", "not-an-address", false},
	} {
		c := transportConn(nil, TransportRequest{Source: tc.source, Destination: "web:22"}, tunnelLocal)
		require.Equal(t, tc.wantRemote, c.RemoteAddr().String(), tc.source)
		_, isTCP := c.RemoteAddr().(*net.TCPAddr)
		require.Equal(t, tc.tcp, isTCP, tc.source)
		require.Equal(t, tunnelLocal, c.LocalAddr(), tc.source)
	}
	// Not over TCP (a test's pipe): the destination names the local end.
	c := transportConn(nil, TransportRequest{Source: "203.0.113.7:5555", Destination: "web:22"}, chanAddr("pipe"))
	require.Equal(t, "web:22", c.LocalAddr().String())
}
