package srv

import (
	"net"
	"os"
	"path/filepath"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"
)

// Agent forwarding is lazy, as in OpenSSH. auth-agent-req@openssh.com only
// records that the client offers its agent. A session started afterwards
// gets SSH_AUTH_SOCK, a unix socket in a fresh 0700 directory owned by the
// login; every connection accepted there opens its own
// auth-agent@openssh.com channel and closes it when the local client goes
// away. Nothing is opened until something uses the socket. A single
// long-lived agent channel opened eagerly is what made OpenSSH clients hang
// on exit (they wait for every channel to close): a channel per use, closed
// after use, cannot.

// agentChannelType is the channel OpenSSH clients accept for their agent.
const agentChannelType = "auth-agent@openssh.com"

// agentSocket is a connection's agent listener and its directory.
type agentSocket struct {
	dir  string
	path string
	ln   *net.UnixListener
}

// requestAgentForwarding records the wish when allowed (node mode; the
// proxy refuses in refuseAgentOnProxy).
func (c *conn) requestAgentForwarding(log logrus.FieldLogger) bool {
	if !c.auth.permits.AgentForwarding {
		log.WithField("reason", "agent forwarding is not allowed for user "+c.auth.id.User+" on this node").Warn("auth-agent-req denied.")
		c.emitRefused("-A", "", "agent forwarding is not allowed for user "+c.auth.id.User+" on this node")
		return false
	}
	c.mu.Lock()
	c.agentWanted = true
	c.mu.Unlock()
	return true
}

// agentSocketFor returns the connection's agent socket path, creating the
// socket on first use, or "" when forwarding was not requested. One
// socket serves every session of the connection, as in OpenSSH.
func (c *conn) agentSocketFor(l *Login) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.agentWanted {
		return "", nil
	}
	if c.agent != nil {
		return c.agent.path, nil
	}
	if c.closed {
		return "", trace.ConnectionProblem(nil, "connection closed")
	}
	dir, err := os.MkdirTemp(c.cfg.AgentSocketDir, "postern-agent-")
	if err != nil {
		return "", trace.ConvertSystemError(err)
	}
	a := &agentSocket{dir: dir, path: filepath.Join(dir, "agent.sock")}
	fail := func(err error) (string, error) {
		_ = os.RemoveAll(dir)
		return "", trace.ConvertSystemError(err)
	}
	// MkdirTemp creates 0700; the login must own it to enter it, and
	// nobody else may.
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, int(l.UID), int(l.GID)); err != nil {
			return fail(err)
		}
	}
	a.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: a.path, Net: "unix"})
	if err != nil {
		return fail(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(a.path, int(l.UID), int(l.GID)); err != nil {
			_ = a.ln.Close()
			return fail(err)
		}
	}
	c.agent = a
	c.go_(func() { c.serveAgent(a) })
	c.log.WithField("socket", a.path).Debug("Agent socket created.")
	return a.path, nil
}

func (c *conn) serveAgent(a *agentSocket) {
	for {
		uc, err := a.ln.AcceptUnix()
		if err != nil {
			return
		}
		c.go_(func() { c.forwardAgentConn(uc) })
	}
}

// forwardAgentConn opens a channel for one local agent client. Splice
// half-closes the channel (EOF) when the local client stops sending, and
// closes it once the client's side has answered with its own EOF.
func (c *conn) forwardAgentConn(uc *net.UnixConn) {
	ch, reqs, err := c.sconn.OpenChannel(agentChannelType, nil)
	if err != nil {
		c.log.WithError(err).Debug("Client refused the agent channel.")
		_ = uc.Close()
		return
	}
	c.go_(func() { ssh.DiscardRequests(reqs) })
	c.log.Debug("Agent channel opened.")
	c.markAgentUse()
	c.splice(uc, ch, "agent", "")
}

// remove deletes the socket and its directory.
func (a *agentSocket) remove(log logrus.FieldLogger) {
	_ = a.ln.Close()
	if err := os.RemoveAll(a.dir); err != nil {
		log.WithError(err).Warn("Removing the agent socket directory failed.")
	}
}
