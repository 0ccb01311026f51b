package srv

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/gravitational/trace"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/observe"
)

// ProxyHandler is the seam through which the proxy reuses this server: it
// keeps authentication, connection management, keep-alives, limits and
// shutdown here, and supplies only where bytes go. With Config.Proxy set:
//   - no node RBAC at connect (the proxy is not a node; the Router checks
//     logins and labels against the target before dialing);
//   - a `subsystem` request on a session channel goes to Subsystem;
//   - a `direct-tcpip` channel (ssh -J) goes to DialDirectTCPIP;
//   - shell and exec are refused with ProxyShellRefusal on stderr; -R and
//     agent forwarding are refused;
//   - anything else is refused, as on a node (proxyPolicy in policy.go).
//
// Errors are shown to the client: trace.UserMessage(err) on the channel's
// stderr for a subsystem, the channel-open failure message for
// direct-tcpip (trace.AccessDenied maps to Prohibited, anything else to
// ConnectionFailed). Never reveal whether a node the user may not see
// exists.
type ProxyHandler interface {
	// Subsystem prepares the subsystem name (e.g. "proxy:host:3022@c" or
	// "proxysites") for id. On success the request is accepted and serve
	// runs with the session channel; its error ends the channel with exit
	// status 1 and the message on stderr, nil with exit status 0.
	Subsystem(ctx context.Context, id *authz.Identity, name string) (serve SubsystemFunc, err error)
	// DialDirectTCPIP connects to the target of a direct-tcpip channel.
	// The returned connection is spliced to the channel with half-close.
	DialDirectTCPIP(ctx context.Context, id *authz.Identity, req DirectTCPIPRequest) (net.Conn, error)
}

// SubsystemFunc serves an accepted subsystem on its session channel. It
// must return when ctx is done (the connection ended).
type SubsystemFunc func(ctx context.Context, ch ssh.Channel) error

// DirectTCPIPRequest is the payload of a direct-tcpip channel (RFC 4254
// section 7.2).
type DirectTCPIPRequest struct {
	Host       string
	Port       uint32
	OriginHost string
	OriginPort uint32
}

// ProxyShellRefusal is what a shell or exec request on the proxy gets.
const ProxyShellRefusal = "this is a Postern proxy: it does not run shells or commands; connect to a node with `ssh -J` or `psh ssh`\r\n"

// refuseShellOnProxy and refuseExecOnProxy answer shell and exec on the
// proxy, which runs nothing: the request succeeds so that the client
// prints ProxyShellRefusal, then the session ends with exit status 1.
func (s *session) refuseShellOnProxy(req *ssh.Request) {
	s.refuseCommandOnProxy(req, "")
}

func (s *session) refuseExecOnProxy(req *ssh.Request) {
	var e execRequest
	if err := ssh.Unmarshal(req.Payload, &e); err != nil {
		reply(req, false)
		return
	}
	s.refuseCommandOnProxy(req, e.Command)
}

func (s *session) refuseCommandOnProxy(req *ssh.Request, command string) {
	if !s.claim() {
		reply(req, false)
		return
	}
	s.setCommand(command)
	reply(req, true)
	_, _ = s.ch.Stderr().Write([]byte(ProxyShellRefusal))
	s.finish(exitCode(1))
}

// refuseAgentOnProxy: the proxy has no sessions to give an agent to.
func (s *session) refuseAgentOnProxy(req *ssh.Request) {
	const reason = "agent forwarding is not available on the proxy"
	s.log.WithField("reason", reason).Warn("auth-agent-req denied.")
	s.c.emitRefused("-A", "", reason)
	reply(req, false)
}

// startProxySubsystem runs a proxy-mode subsystem request (the session is
// already claimed).
func (s *session) startProxySubsystem(req *ssh.Request, name string) {
	serve, err := s.c.cfg.Proxy.Subsystem(s.ctx, s.c.auth.id, name)
	if err != nil {
		// Accept, explain on stderr, then end the channel with exit status
		// 1. A refused subsystem request is fatal in the OpenSSH client
		// before it prints what already arrived on stderr, so a plain
		// refusal would hide the reason ("ambiguous host ...", "not
		// found", a malformed target) from the user who needs it.
		s.log.WithError(err).WithField("subsystem", name).Info("Proxy subsystem refused.")
		reply(req, true)
		_, _ = fmt.Fprintf(s.ch.Stderr(), "%v\r\n", strings.ReplaceAll(trace.UserMessage(err), "\n", "\r\n"))
		s.finish(exitCode(1))
		return
	}
	reply(req, true)
	s.log.WithField("subsystem", name).Info("Proxy subsystem started.")
	s.emitStart(false)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		st := exitCode(0)
		if err := serve(s.ctx, s.ch); err != nil {
			s.log.WithError(err).Debug("Proxy subsystem ended with an error.")
			_, _ = fmt.Fprintf(s.ch.Stderr(), "%v\r\n", trace.UserMessage(err))
			st = exitCode(1)
		}
		s.finish(st)
	}()
}

// handleProxyDirectTCPIP serves direct-tcpip in proxy mode (ssh -J).
func (c *conn) handleProxyDirectTCPIP(nch ssh.NewChannel) {
	var p directTCPIPPayload
	if err := ssh.Unmarshal(nch.ExtraData(), &p); err != nil {
		_ = nch.Reject(ssh.ConnectionFailed, "malformed direct-tcpip request")
		return
	}
	req := DirectTCPIPRequest(p)
	ctx, span := c.cfg.Tracer.Start(c.ctx, "ssh.channel", oteltrace.WithAttributes(attribute.String("postern.channel_type", "direct-tcpip")))
	target, err := c.cfg.Proxy.DialDirectTCPIP(ctx, c.auth.id, req)
	if err != nil {
		observe.End(span, err)
		c.log.WithError(err).WithField("target", net.JoinHostPort(req.Host, fmt.Sprint(req.Port))).Info("direct-tcpip refused.")
		_ = nch.Reject(rejectReason(err), trace.UserMessage(err))
		return
	}
	defer span.End()
	c.spliceChannel(nch, target, "direct-tcpip", net.JoinHostPort(req.Host, fmt.Sprint(req.Port)))
}
