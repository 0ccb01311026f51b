package srv

import (
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// echoServer echoes until EOF, then half-closes: it proves both that data
// flows and that EOF crosses the forward.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().String()
}

// echoRoundTrip writes msg, half-closes and expects msg back then EOF; c
// is a net.Conn or an ssh.Channel.
func echoRoundTrip(t *testing.T, c io.ReadWriter, msg string) {
	t.Helper()
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	require.NoError(t, c.(interface{ CloseWrite() error }).CloseWrite())
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, msg, string(got))
}

func TestLocalForward(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	target := echoServer(t)
	conn, err := c.Dial("tcp", target)
	require.NoError(t, err)
	defer conn.Close()
	echoRoundTrip(t, conn, strings.Repeat("forward me ", 10000))
}

func TestRemoteForward(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	ln, err := c.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	// The client side serves what arrives through the node's listener.
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.Copy(conn, conn)
		_ = conn.(interface{ CloseWrite() error }).CloseWrite()
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	require.NotZero(t, port)
	nc, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(port)))
	require.NoError(t, err)
	defer nc.Close()
	echoRoundTrip(t, nc, "through -R")
	<-done

	// Cancelling the forward closes the node's listener.
	require.NoError(t, ln.Close())
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(port)))
		if err != nil {
			return true
		}
		c.Close()
		return false
	}, 5*time.Second, 10*time.Millisecond)
}

// TestRemoteForwardEndsWithConnection: -R listeners live only as long as
// their connection.
func TestRemoteForwardEndsWithConnection(t *testing.T) {
	e := newTestEnv(t)
	c, err := e.dialAs(e.me, e.signer(e.me))
	require.NoError(t, err)
	ln, err := c.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(port)))
		if err != nil {
			return true
		}
		c.Close()
		return false
	}, 5*time.Second, 10*time.Millisecond)
}

func itoa(i int) string { return strconv.Itoa(i) }

func mustEd25519(t *testing.T) ed25519.PrivateKey {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return priv
}

func TestForwardingDeniedByRole(t *testing.T) {
	e := newTestEnv(t)
	role := srvtest.AccessRole()
	role.Spec.PortForwarding = false
	role.Spec.ForwardAgent = false
	e.ap.UpsertRole(role)
	c := e.dial()

	_, err := c.Dial("tcp", echoServer(t))
	var openErr *ssh.OpenChannelError
	require.ErrorAs(t, err, &openErr)
	require.Equal(t, ssh.Prohibited, openErr.Reason)
	require.Contains(t, openErr.Message, "port forwarding is not allowed")
	e.requireLog("direct-tcpip denied", "port forwarding is not allowed")

	_, err = c.Listen("tcp", "127.0.0.1:0")
	require.Error(t, err)
	e.requireLog("tcpip-forward denied", "port forwarding is not allowed")

	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.Error(t, agent.RequestAgentForwarding(s))
	e.requireLog("auth-agent-req denied", "agent forwarding is not allowed")
	out, err := s.Output("echo ${SSH_AUTH_SOCK:-none}")
	require.NoError(t, err)
	require.Equal(t, "none\n", string(out))
}

// TestForwardingDeniedByCert: the certificate's permit-* extensions are
// honoured even when the role allows.
func TestForwardingDeniedByCert(t *testing.T) {
	e := newTestEnv(t)
	s := e.userCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Cluster: testCluster,
		Extensions: map[string]string{}})
	c, err := e.dialAs(e.me, s)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Dial("tcp", echoServer(t))
	require.Error(t, err)
	sess, err := c.NewSession()
	require.NoError(t, err)
	defer sess.Close()
	require.Error(t, sess.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	require.Error(t, agent.RequestAgentForwarding(sess))
}

// agentCounter serves an in-memory agent for every auth-agent@openssh.com
// channel the server opens, and counts them.
type agentCounter struct {
	opened atomic.Int32
	open   atomic.Int32 // currently open
	wg     sync.WaitGroup
}

func serveAgentChannels(t *testing.T, c *ssh.Client, keyring agent.Agent) *agentCounter {
	ac := &agentCounter{}
	chans := c.HandleChannelOpen("auth-agent@openssh.com")
	require.NotNil(t, chans)
	ac.wg.Add(1)
	go func() {
		defer ac.wg.Done()
		for nch := range chans {
			ch, reqs, err := nch.Accept()
			if err != nil {
				continue
			}
			ac.opened.Add(1)
			ac.open.Add(1)
			go ssh.DiscardRequests(reqs)
			ac.wg.Add(1)
			go func() {
				defer ac.wg.Done()
				_ = agent.ServeAgent(keyring, ch)
				_ = ch.Close()
				ac.open.Add(-1)
			}()
		}
	}()
	t.Cleanup(ac.wg.Wait)
	return ac
}

func TestLazyAgentForwarding(t *testing.T) {
	e := newTestEnv(t)
	c, err := e.dialAs(e.me, e.signer(e.me))
	require.NoError(t, err)
	keyring := agent.NewKeyring()
	require.NoError(t, keyring.Add(agent.AddedKey{PrivateKey: mustEd25519(t), Comment: "test-key"}))
	ac := serveAgentChannels(t, c, keyring)

	s, err := c.NewSession()
	require.NoError(t, err)
	require.NoError(t, agent.RequestAgentForwarding(s))
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, s.Start(`echo "sock=$SSH_AUTH_SOCK"; stat -c '%a %U' "$(dirname "$SSH_AUTH_SOCK")"; cat`))
	out := w.waitFor(t, "\n"+"700 ")
	sock := strings.TrimPrefix(strings.Split(out, "\n")[0], "sock=")
	require.NotEmpty(t, sock)
	require.True(t, strings.HasPrefix(sock, e.srv.cfg.AgentSocketDir), sock)
	require.Contains(t, out, "700 "+e.me)

	// Nothing used the socket: no channel was opened.
	require.EqualValues(t, 0, ac.opened.Load())

	// One use, one channel, closed after use.
	listKeys(t, sock)
	require.EqualValues(t, 1, ac.opened.Load())
	require.Eventually(t, func() bool { return ac.open.Load() == 0 }, 5*time.Second, 5*time.Millisecond)

	// Two concurrent users: two channels open at the same time.
	u1, err := net.Dial("unix", sock)
	require.NoError(t, err)
	u2, err := net.Dial("unix", sock)
	require.NoError(t, err)
	k1, err := agent.NewClient(u1).List()
	require.NoError(t, err)
	k2, err := agent.NewClient(u2).List()
	require.NoError(t, err)
	require.Len(t, k1, 1)
	require.Len(t, k2, 1)
	require.EqualValues(t, 3, ac.opened.Load())
	require.EqualValues(t, 2, ac.open.Load())
	u1.Close()
	u2.Close()
	require.Eventually(t, func() bool { return ac.open.Load() == 0 }, 5*time.Second, 5*time.Millisecond)

	// The session ends promptly; then the connection; the socket
	// directory goes with it.
	require.NoError(t, stdin.Close())
	require.NoError(t, s.Wait())
	dir := filepath.Dir(sock)
	_, err = os.Stat(dir)
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() { closed <- c.Wait() }()
	require.NoError(t, c.Close())
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("client connection did not close promptly")
	}
	require.Eventually(t, func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	}, 5*time.Second, 10*time.Millisecond)
}

func listKeys(t *testing.T, sock string) {
	t.Helper()
	u, err := net.Dial("unix", sock)
	require.NoError(t, err)
	defer u.Close()
	keys, err := agent.NewClient(u).List()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, "test-key", keys[0].Comment)
}

// TestForwardedChannelRequestsRefused: requests on a direct-tcpip channel
// (none is defined) are each refused, more of them than x/crypto queues
// per channel (16), so a stream nobody drained would stall the connection;
// two such channels on one connection, and data still flows on both. The
// control loop refuses them (conn.discardRequests): no goroutine per
// channel.
func TestForwardedChannelRequestsRefused(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	target := echoServer(t)
	host, port, err := net.SplitHostPort(target)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	payload := ssh.Marshal(struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}{host, uint32(p), "127.0.0.1", 1})
	var chs []ssh.Channel
	for range 2 {
		ch, reqs, err := c.OpenChannel("direct-tcpip", payload)
		require.NoError(t, err)
		go ssh.DiscardRequests(reqs)
		chs = append(chs, ch)
	}
	for _, ch := range chs {
		for i := range 40 {
			ok, err := ch.SendRequest("made-up@example.com", true, nil)
			require.NoError(t, err, "request %d", i)
			require.False(t, ok, "request %d", i)
		}
	}
	for _, ch := range chs {
		echoRoundTrip(t, ch, "still flowing")
		ch.Close()
	}
}
