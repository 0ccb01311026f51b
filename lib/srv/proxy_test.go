package srv

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/utils"
)

// fakeProxy is the shape of the Router-backed handler the proxy plugs in
// (lib/proxy/sshproxy): it serves the names the real one serves
// (proxysites, nodes, proxy:HOST[:PORT]) and refuses the rest with the
// real one's words; every target resolves to one echo server.
type fakeProxy struct {
	target string
	// seen receives the identity of each proxy: subsystem; nil: not
	// recorded.
	seen chan *authz.Identity
	// asked receives every request handed to the handler; nil: not
	// recorded.
	asked chan string
}

func (p *fakeProxy) Subsystem(ctx context.Context, id *authz.Identity, name string) (SubsystemFunc, error) {
	if p.asked != nil {
		p.asked <- "subsystem:" + name
	}
	switch {
	case name == "proxysites" || name == "nodes":
		return func(ctx context.Context, ch ssh.Channel) error {
			_, err := ch.Write([]byte("[]"))
			return err
		}, nil
	case !strings.HasPrefix(name, "proxy:"):
		return nil, trace.BadParameter("invalid proxy subsystem request %q: expected proxy:host:port[@cluster]", name)
	}
	if p.seen != nil {
		p.seen <- id
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", p.target)
		if err != nil {
			return trace.ConnectionProblem(err, "dial failed")
		}
		_, _, err = utils.Splice(ctx, ch, nc)
		return err
	}, nil
}

func (p *fakeProxy) DialDirectTCPIP(ctx context.Context, id *authz.Identity, req DirectTCPIPRequest) (net.Conn, error) {
	if p.asked != nil {
		p.asked <- "direct-tcpip"
	}
	if req.Host == "secret" {
		return nil, trace.AccessDenied("access denied to %q", req.Host)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", p.target)
}

func TestProxyModeSeam(t *testing.T) {
	proxy := &fakeProxy{target: echoServer(t), seen: make(chan *authz.Identity, 4)}
	e := newTestEnv(t, func(c *Config) {
		c.Proxy = proxy
		c.GetNode = nil
	})
	c := e.dial()

	// proxy:HOST:PORT subsystem carries raw bytes, with half-close.
	s, err := c.NewSession()
	require.NoError(t, err)
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, s.RequestSubsystem("proxy:node1:3022@example"))
	id := <-proxy.seen
	require.Equal(t, "alice", id.User)
	require.Equal(t, e.me, id.Login)
	require.NotNil(t, id.Checker)
	_, err = stdin.Write([]byte("raw ssh bytes"))
	require.NoError(t, err)
	require.NoError(t, stdin.Close())
	got, err := io.ReadAll(stdout)
	require.NoError(t, err)
	require.Equal(t, "raw ssh bytes", string(got))
	s.Close()

	// A malformed subsystem: the message reaches stderr (the request is
	// accepted so that OpenSSH prints it, see startProxySubsystem).
	s, err = c.NewSession()
	require.NoError(t, err)
	stderrPipe, err := s.StderrPipe()
	require.NoError(t, err)
	w := watchOutput(stderrPipe)
	_ = s.RequestSubsystem("bogus")
	require.Contains(t, w.waitFor(t, "expected"), `invalid proxy subsystem request "bogus": expected proxy:host:port[@cluster]`)
	s.Close()

	// Shell and exec: refused with a hint, exit status 1.
	_, stderr, err := run(t, c, "id")
	var exitErr *ssh.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 1, exitErr.ExitStatus())
	require.Contains(t, stderr, "ssh -J")

	// direct-tcpip goes to the handler; AccessDenied becomes Prohibited.
	conn, err := c.Dial("tcp", "node1:3022")
	require.NoError(t, err)
	echoRoundTrip(t, conn, "via -J")
	conn.Close()
	_, err = c.Dial("tcp", "secret:22")
	var openErr *ssh.OpenChannelError
	require.ErrorAs(t, err, &openErr)
	require.Equal(t, ssh.Prohibited, openErr.Reason)
	require.Contains(t, openErr.Message, `access denied to "secret"`)

	// No -R and no agent on the proxy.
	_, err = c.Listen("tcp", "127.0.0.1:0")
	require.Error(t, err)
	s, err = c.NewSession()
	require.NoError(t, err)
	require.Error(t, agent.RequestAgentForwarding(s))
	s.Close()

}
