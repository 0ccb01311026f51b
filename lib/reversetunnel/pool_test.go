package reversetunnel

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// proxyList is a settable Proxies func for several servers.
type proxyList struct {
	mu   sync.Mutex
	list []AnnouncedProxy
}

func (l *proxyList) set(ps ...AnnouncedProxy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.list = ps
}

func (l *proxyList) get(context.Context) ([]AnnouncedProxy, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]AnnouncedProxy(nil), l.list...), nil
}

// startServer runs a tunnel server of ca with proxy identity uuid.
func startServer(t *testing.T, ca *srvtest.CA, uuid string, mutate func(*ServerConfig)) (*Server, string, *events.Recorder) {
	t.Helper()
	audit := events.NewRecorder()
	cfg := ServerConfig{
		HostSigner:       ca.RoleHostSigner(t, srvtest.HostCert{UUID: uuid, Role: RoleProxy, Principals: []string{"127.0.0.1"}}),
		HostCAs:          func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey()} },
		AnnounceInterval: 20 * time.Millisecond,
		Deps:             observe.Deps{Audit: audit},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := NewServer(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		<-done
	})
	return s, ln.Addr().String(), audit
}

func startPool(t *testing.T, ca *srvtest.CA, addr string, h ConnHandler) *Pool {
	t.Helper()
	p, err := NewPool(AgentConfig{
		ProxyAddr: addr,
		Signer:    ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}),
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey()} },
		Handler:   h,
	}, nil)
	require.NoError(t, err)
	p.Start()
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func waitGone(t *testing.T, s *Server, uuid string) {
	t.Helper()
	require.Eventually(t, func() bool { return !s.HasTunnel(uuid) }, 10*time.Second, 10*time.Millisecond, "tunnel from %s still on the server", uuid)
}

// TestAnnouncedKeepAliveApplies: the keep-alive setting the server reads
// (the cluster networking config) reaches the agent in an announcement
// and is applied there while the tunnel lives; a change is announced
// again without a reconnect.
func TestAnnouncedKeepAliveApplies(t *testing.T) {
	ca := srvtest.NewCA(t)
	var interval atomic.Int64
	interval.Store(int64(7 * time.Second))
	s, addr, _ := startServer(t, ca, "proxy-1", func(c *ServerConfig) {
		c.KeepAlive = func() (time.Duration, int) { return time.Duration(interval.Load()), 4 }
	})
	p := startPool(t, ca, addr, echoHandler(make(chan string, 4)))
	waitTunnel(t, s, "node-1")
	a := p.Bootstrap()
	require.Eventually(t, func() bool { i, c := a.keepAlive(); return i == 7*time.Second && c == 4 }, 10*time.Second, 10*time.Millisecond)
	i, c := s.keepAlive()
	require.Equal(t, 7*time.Second, i)
	require.Equal(t, 4, c)
	interval.Store(int64(2 * time.Second))
	require.Eventually(t, func() bool { i, _ := a.keepAlive(); return i == 2*time.Second }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 0.0, testutil.ToFloat64(a.reconnects), "no reconnect for a settings change")
}

// TestPoolKeepsATunnelToEveryProxy: a node given one proxy learns the
// other from the announcement, keeps a tunnel to each (the second at its
// own announced address), and drops a proxy that leaves the list.
func TestPoolKeepsATunnelToEveryProxy(t *testing.T) {
	ca := srvtest.NewCA(t)
	var list proxyList
	s1, addr1, _ := startServer(t, ca, "proxy-1", func(c *ServerConfig) { c.Proxies = list.get })
	s2, addr2, _ := startServer(t, ca, "proxy-2", func(c *ServerConfig) { c.Proxies = list.get })
	list.set(AnnouncedProxy{UUID: "proxy-1", TunnelAddr: addr1}, AnnouncedProxy{UUID: "proxy-2", TunnelAddr: addr2})
	p := startPool(t, ca, addr1, echoHandler(make(chan string, 8)))
	waitTunnel(t, s1, "node-1")
	waitTunnel(t, s2, "node-1")
	require.Len(t, p.Agents(), 2, "one agent per proxy: the bootstrap is proxy-1's")
	conn, err := s2.DialTunnel(context.Background(), "node-1", "1.2.3.4:5", "node-1:0")
	require.NoError(t, err)
	conn.Close()

	list.set(AnnouncedProxy{UUID: "proxy-1", TunnelAddr: addr1})
	waitGone(t, s2, "node-1")
	require.Eventually(t, func() bool { return len(p.Agents()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.True(t, s1.HasTunnel("node-1"))
}

// TestPoolRefusesAnotherProxyAtTheAnnouncedAddress: an announcement that
// names proxy-2 at an address where another proxy answers gets no
// tunnel there: the agent checks the proxy's certificate UUID.
func TestPoolRefusesAnotherProxyAtTheAnnouncedAddress(t *testing.T) {
	ca := srvtest.NewCA(t)
	var list proxyList
	s1, addr1, _ := startServer(t, ca, "proxy-1", func(c *ServerConfig) { c.Proxies = list.get })
	s3, addr3, _ := startServer(t, ca, "proxy-3", nil)
	list.set(AnnouncedProxy{UUID: "proxy-1", TunnelAddr: addr1}, AnnouncedProxy{UUID: "proxy-2", TunnelAddr: addr3})
	p := startPool(t, ca, addr1, echoHandler(make(chan string, 8)))
	waitTunnel(t, s1, "node-1")
	require.Eventually(t, func() bool { return len(p.Agents()) == 2 }, 10*time.Second, 10*time.Millisecond)
	var pooled *Agent
	for _, a := range p.Agents() {
		if a != p.Bootstrap() {
			pooled = a
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.Error(t, pooled.WaitConnected(ctx), "the agent must not accept proxy-3 as proxy-2")
	require.False(t, s3.HasTunnel("node-1"))
}

// TestMoveBeforeBreak: a proxy asked to shut down asks its agents to
// move; the node opens (or already has) a tunnel to the other proxy
// before it drops this one, a session running on the old tunnel goes on
// until it ends, and no new channel is taken there meanwhile.
func TestMoveBeforeBreak(t *testing.T) {
	ca := srvtest.NewCA(t)
	var list proxyList
	s1, addr1, _ := startServer(t, ca, "proxy-1", func(c *ServerConfig) { c.Proxies = list.get })
	s2, addr2, _ := startServer(t, ca, "proxy-2", func(c *ServerConfig) { c.Proxies = list.get })
	list.set(AnnouncedProxy{UUID: "proxy-1", TunnelAddr: addr1}, AnnouncedProxy{UUID: "proxy-2", TunnelAddr: addr2})
	startPool(t, ca, addr1, echoHandler(make(chan string, 8)))
	waitTunnel(t, s1, "node-1")
	waitTunnel(t, s2, "node-1")
	session, err := s1.DialTunnel(context.Background(), "node-1", "1.2.3.4:5", "node-1:0")
	require.NoError(t, err)

	list.set(AnnouncedProxy{UUID: "proxy-2", TunnelAddr: addr2})
	s1.AskToMove()
	// The running session still works over the old tunnel.
	require.Eventually(t, func() bool {
		c, err := s1.DialTunnel(context.Background(), "node-1", "", "")
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "a draining tunnel takes no new channel")
	_, err = session.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(session, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))
	require.True(t, s1.HasTunnel("node-1"), "kept while a session runs on it")
	require.True(t, s2.HasTunnel("node-1"), "the node stays reachable elsewhere")
	session.Close()
	waitGone(t, s1, "node-1")
	require.True(t, s2.HasTunnel("node-1"))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s1.Shutdown(ctx))
}

// TestTunnelRequestsCannotClaimAnotherNode: nothing a node sends after
// the handshake names it: global requests and channels naming another
// node's UUID are refused and audited, and nothing is registered under
// that UUID.
func TestTunnelRequestsCannotClaimAnotherNode(t *testing.T) {
	f := newFixture(t, nil)
	signer := f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode})
	nc, err := net.Dial("tcp", f.addr)
	require.NoError(t, err)
	defer nc.Close()
	registered := f.srv.TunnelRegistered("node-1")
	c, chans, reqs, err := ssh.NewClientConn(nc, f.addr, &ssh.ClientConfig{
		User: "node-2", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	require.NoError(t, err)
	defer c.Close()
	go ssh.DiscardRequests(reqs)
	go func() {
		for range chans {
		}
	}()
	<-registered
	claim, _ := json.Marshal(map[string]string{"uuid": "node-2"})
	for _, typ := range []string{"postern-register@postern.dev", "postern-announce@postern.dev", "tcpip-forward"} {
		ok, _, err := c.SendRequest(typ, true, claim)
		require.NoError(t, err)
		require.False(t, ok, typ)
	}
	_, _, err = c.OpenChannel(ChannelAuth, claim)
	require.Error(t, err, "an auth channel carries no claims")
	_, _, err = c.OpenChannel(ChannelTransport, claim)
	require.Error(t, err)
	require.False(t, f.srv.HasTunnel("node-2"))
	require.True(t, f.srv.HasTunnel("node-1"))
	var reasons []string
	for _, e := range f.audit.Events() {
		if e.Type == events.AccessDenied {
			r, _ := e.Fields[events.FieldReason].(string)
			reasons = append(reasons, r)
		}
	}
	require.Len(t, reasons, 5, "%v", reasons)
	for _, r := range reasons {
		require.True(t, strings.Contains(r, `tunnel from node "node-1"`), r)
	}
	require.Contains(t, fmt.Sprint(reasons), `global request "postern-register@postern.dev"`)
}

// TestAgentRefusesProxyOfAnotherCluster: a tunnel server with a valid
// proxy certificate of another cluster's host CA gets nothing from the
// agent.
func TestAgentRefusesProxyOfAnotherCluster(t *testing.T) {
	ca, other := srvtest.NewCA(t), srvtest.NewCA(t)
	// The server would take the node (it trusts both CAs): only the
	// agent's own check can refuse.
	s, addr, _ := startServer(t, other, "proxy-x", func(c *ServerConfig) {
		c.HostCAs = func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey(), other.Signer.PublicKey()} }
	})
	audit := events.NewRecorder()
	a, err := NewAgent(AgentConfig{
		ProxyAddr: addr,
		Signer:    ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}),
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey()} },
		Handler:   func(nc net.Conn) { t.Error("served a channel from an untrusted proxy"); nc.Close() },
		Deps:      observe.Deps{Audit: audit},
	})
	require.NoError(t, err)
	a.Start()
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := audit.Wait(ctx, events.AccessDenied, func(events.Event) bool { return true })
	require.NoError(t, err)
	require.Equal(t, "tunnel", ev.Fields[events.FieldKind])
	require.Contains(t, ev.Fields[events.FieldReason], "is not a proxy of this cluster")
	require.Contains(t, ev.Fields[events.FieldReason], "not signed by a trusted host CA")
	require.False(t, s.HasTunnel("node-1"))
	require.False(t, a.Connected())
}

// TestAgentNamesTheSettingForAMissingPrincipal: a proxy of this cluster
// whose certificate lacks the address the node dialed is refused with
// a message that names the address and what to change, not x/crypto's
// bare "principal not in the set of valid principals".
func TestAgentNamesTheSettingForAMissingPrincipal(t *testing.T) {
	ca := srvtest.NewCA(t)
	s, addr, _ := startServer(t, ca, "proxy-x", func(c *ServerConfig) {
		c.HostSigner = ca.RoleHostSigner(t, srvtest.HostCert{UUID: "proxy-x", Role: RoleProxy, Principals: []string{"proxy.example.com"}})
	})
	audit := events.NewRecorder()
	a, err := NewAgent(AgentConfig{
		ProxyAddr: addr,
		Signer:    ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}),
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{ca.Signer.PublicKey()} },
		Handler:   func(nc net.Conn) { t.Error("served a channel from a proxy at an unnamed address"); nc.Close() },
		Deps:      observe.Deps{Audit: audit},
	})
	require.NoError(t, err)
	a.Start()
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := audit.Wait(ctx, events.AccessDenied, func(events.Event) bool { return true })
	require.NoError(t, err)
	reason := fmt.Sprint(ev.Fields[events.FieldReason])
	require.Contains(t, reason, "was refused: ")
	require.Contains(t, reason, `does not name "127.0.0.1"`)
	require.Contains(t, reason, "proxy.example.com")
	require.Contains(t, reason, "public_addrs")
	require.False(t, s.HasTunnel("node-1"))
}
