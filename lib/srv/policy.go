package srv

import (
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"
)

// policy is what one server serves, decided once in New from its mode and
// consulted by every dispatch: which channel types a client may open,
// which global requests and which session-channel requests it may send,
// and which subsystems it may start. Each served name maps to its handler;
// a name that is not in a map is refused by the one default of its kind
// (an unknown channel type, a failure reply). So a request type nobody
// thought of is refused in both modes, rather than served by a branch that
// forgot to ask "am I the proxy?". TestModePolicy walks the whole SSH
// vocabulary against it.
type policy struct {
	// mode is "node" or "proxy", for logs.
	mode string
	// checkNode is set in node mode: the login is checked against this
	// node's labels at connect and again at every session, locks on this
	// node apply, and audit events name it. The proxy is not a node: the
	// Router checks the target before dialing.
	checkNode bool
	// channels are the channel types a client may open (RFC 4254 section
	// 5.1). Types only a server opens (forwarded-tcpip, x11,
	// auth-agent@openssh.com) are not among them.
	channels map[string]func(c *conn, nch ssh.NewChannel)
	// global are the global requests served (RFC 4254 section 4).
	global map[string]func(c *conn, req *ssh.Request)
	// session are the requests served on a `session` channel (RFC 4254
	// section 6).
	session map[string]func(s *session, req *ssh.Request)
	// subsystem starts a subsystem the session has claimed; in node mode
	// it knows only sftp, in proxy mode it hands every name to the
	// ProxyHandler, whose grammar (proxy:..., proxysites, nodes) refuses
	// the rest.
	subsystem func(s *session, req *ssh.Request, name string)
	// lockOutGrace is how long a locked connection lives after its
	// sessions were told why (see lockOutProxyGrace); zero on a node.
	lockOutGrace time.Duration
}

// Request names this server knows.
const (
	reqTCPIPForward       = "tcpip-forward"
	reqCancelTCPIPForward = "cancel-tcpip-forward"
	reqAgentForwarding    = "auth-agent-req@openssh.com"
)

// newPolicy decides the server's policy from cfg, once.
func newPolicy(cfg Config) *policy {
	if cfg.Proxy != nil {
		return proxyPolicy()
	}
	return nodePolicy()
}

// nodePolicy: a node runs shells, commands and sftp as the login, and
// forwards ports and the agent when the certificate and a role allow.
func nodePolicy() *policy {
	return &policy{
		mode:      "node",
		checkNode: true,
		channels: map[string]func(*conn, ssh.NewChannel){
			"session":      (*conn).handleSession,
			"direct-tcpip": (*conn).handleLocalForward,
		},
		global: map[string]func(*conn, *ssh.Request){
			reqTCPIPForward:       (*conn).handleTCPIPForward,
			reqCancelTCPIPForward: (*conn).handleCancelTCPIPForward,
		},
		session: sessionRequests(map[string]func(*session, *ssh.Request){
			"pty-req":          func(s *session, req *ssh.Request) { s.handlePtyReq(req, true) },
			"shell":            (*session).handleShell,
			"exec":             (*session).handleExec,
			reqAgentForwarding: func(s *session, req *ssh.Request) { reply(req, s.c.requestAgentForwarding(s.log)) },
		}),
		subsystem: (*session).startNodeSubsystemOrJoin,
	}
}

// proxyPolicy: the proxy only routes. Subsystems and direct-tcpip go to
// the ProxyHandler; shell and exec get ProxyShellRefusal; -R and agent
// forwarding are refused and audited.
func proxyPolicy() *policy {
	return &policy{
		mode: "proxy",
		channels: map[string]func(*conn, ssh.NewChannel){
			"session":      (*conn).handleSession,
			"direct-tcpip": (*conn).handleProxyDirectTCPIP,
		},
		global: map[string]func(*conn, *ssh.Request){
			reqTCPIPForward: (*conn).refuseTCPIPForwardOnProxy,
		},
		session: sessionRequests(map[string]func(*session, *ssh.Request){
			// A pty is harmless here (nothing runs on it) and clients ask
			// for one before a subsystem or a refused shell.
			"pty-req":          func(s *session, req *ssh.Request) { s.handlePtyReq(req, false) },
			"shell":            (*session).refuseShellOnProxy,
			"exec":             (*session).refuseExecOnProxy,
			reqAgentForwarding: (*session).refuseAgentOnProxy,
		}),
		subsystem:    (*session).startProxySubsystem,
		lockOutGrace: lockOutProxyGrace,
	}
}

// sessionRequests are the session requests both modes answer alike (env
// by the allow-list; subsystem by the mode's subsystem starter;
// window-change and signal only act on a pty or a process there is; x11
// is never forwarded), plus the mode's own.
func sessionRequests(own map[string]func(*session, *ssh.Request)) map[string]func(*session, *ssh.Request) {
	m := map[string]func(*session, *ssh.Request){
		"env":           (*session).handleEnv,
		"subsystem":     (*session).handleSubsystem,
		"window-change": (*session).handleWindowChange,
		"signal":        (*session).handleSignal,
		"x11-req":       (*session).refuseX11,
	}
	for name, handle := range own {
		m[name] = handle
	}
	return m
}

// channelHandler returns the handler of nch's type, or rejects nch as an
// unknown channel type and returns nil.
func (p *policy) channelHandler(c *conn, nch ssh.NewChannel) func(*conn, ssh.NewChannel) {
	t := nch.ChannelType()
	handle, ok := p.channels[t]
	if !ok {
		c.log.WithField("channel_type", t).Debug("Rejected unknown channel type.")
		_ = nch.Reject(ssh.UnknownChannelType, fmt.Sprintf("unknown channel type %q", t))
		return nil
	}
	return handle
}

// dispatchRequest serves req with its handler in handlers (a policy's
// global or session requests), or fails it: the one default refusal of
// every request a policy does not list.
func dispatchRequest[T any](handlers map[string]func(T, *ssh.Request), on T, log logrus.FieldLogger, req *ssh.Request) {
	handle, ok := handlers[req.Type]
	if !ok {
		log.WithField("request", req.Type).Debug("Refused unknown request.")
		reply(req, false)
		return
	}
	handle(on, req)
}
