package service

import (
	"fmt"
	"net"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/observe"
)

// listenerCaps is how one listener is capped, beyond what every listener
// gets (the config's total cap and a share of the descriptor budget).
type listenerCaps struct {
	// perIP overrides the per-address cap (negative: none): a node sees
	// every proxied session arrive from the proxy's address, and the
	// tunnel port every tunnel and data connection of a site behind one
	// NAT, so a per-address cap there would cap a site, not a client.
	perIP int
	// sshRefusal: a refused TCP connection gets a one-line reason (SSH
	// allows text before its version line; TLS ports do not).
	sshRefusal bool
	// withRate adds the new-connection rate per address, which bounds
	// handshake work spent on clients reconnecting in a loop.
	withRate bool
	// handshakes counts connections against the handshake caps until the
	// server says they authenticated (limiter.ListenerOptions.Handshakes).
	handshakes bool
	// descriptors is what one connection costs the budget; zero means 1.
	descriptors int
}

// Descriptor costs per connection, by listener: what the process holds
// for one connection accepted there.
const (
	// descriptorsPerProxySession: a forwarded session holds two
	// descriptors at the proxy, the client's socket and the dial to the
	// node (a tunnel node's data connection is counted on the tunnel
	// port as well, which errs on the side of refusing early).
	descriptorsPerProxySession = 2
	// descriptorsPerNodeSession: the socket and the session's pty (or
	// the first of its pipes).
	descriptorsPerNodeSession = 2
)

// descriptorReserve are kept out of the budget for everything else the
// process opens (its listeners, the backend, the auth API's connections,
// recordings being written and uploaded, logs, outgoing dials of the web
// terminal), so that a spent budget refuses one more client with a reason
// instead of failing an accept, a dial or a backend write with EMFILE
// somewhere else.
const descriptorReserve = 256

// capListener puts the connection caps of the config on one listener and
// counts its connections against the process's descriptor budget. The
// limiter also serves the per-user caps inside the SSH server.
func (p *Process) capListener(name string, ln net.Listener, caps listenerCaps) (net.Listener, *limiter.ConnectionLimiter, error) {
	l := p.cfg.Limits
	perIP := caps.perIP
	if perIP == 0 {
		perIP = l.MaxConnectionsPerIP
	}
	if caps.descriptors == 0 {
		caps.descriptors = 1
	}
	budget := p.descriptorBudget()
	if name == ListenerProxySSH && budget != nil {
		p.warnSessionBudget(budget)
	}
	lim, err := limiter.NewConnectionLimiter(limiter.Config{
		Name:                  name,
		MaxConnections:        l.MaxConnections,
		MaxConnectionsPerIP:   perIP,
		MaxConnectionsPerUser: l.MaxConnectionsPerUser,
		MaxSessionsPerUser:    l.MaxSessionsPerUser,
		MaxHandshakes:         l.MaxHandshakes,
		MaxHandshakesPerIP:    l.MaxHandshakesPerIP,
		Budget:                budget,
		DescriptorsPerConn:    caps.descriptors,
		Deps:                  p.deps(observe.ComponentLimiter, nil),
	})
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	opts := limiter.ListenerOptions{OnRefuse: p.auditRefusal, Handshakes: caps.handshakes}
	if caps.sshRefusal {
		opts.Refusal = limiter.SSHRefusal
	}
	if caps.withRate {
		// The real clock: refilling buckets on a test's fake clock would
		// starve every client after the first burst.
		deps := p.deps(observe.ComponentLimiter, nil)
		deps.Clock = nil
		rate, err := limiter.NewRateLimiter(limiter.RateConfig{Name: name, Deps: deps})
		if err != nil {
			return nil, nil, trace.Wrap(err)
		}
		opts.Rate = rate
	}
	return limiter.WrapListener(ln, lim, opts), lim, nil
}

// descriptorBudget is the budget every listener's connections share
// (limiter.Budget explains why one): limits.max_descriptors when set
// (negative: none), else the process's descriptor limit less
// descriptorReserve. The daemon raised its soft limit to the hard one at
// start (raiseFileLimit). Nil when there is none (an unlimited or
// unreadable RLIMIT_NOFILE, or max_descriptors: -1).
func (p *Process) descriptorBudget() *limiter.Budget {
	p.budgetOnce.Do(func() {
		size, reason := p.cfg.Limits.MaxDescriptors, "limits.max_descriptors"
		if size < 0 {
			return
		}
		if size == 0 {
			soft, _, ok := fileLimit()
			if !ok {
				return
			}
			size = int(int64(soft) - descriptorReserve)
			if size < 1 {
				size = 1
			}
			reason = fmt.Sprintf("this process's file descriptor limit, RLIMIT_NOFILE %d, less %d kept for the rest of the process", soft, descriptorReserve)
		}
		b, err := limiter.NewBudget(limiter.BudgetConfig{Descriptors: size, Reason: reason, Metrics: p.registry})
		if err != nil {
			p.log.WithError(err).Warn("No file descriptor budget for the listeners.")
			return
		}
		p.log.WithFields(logrus.Fields{"descriptors": size, "reason": reason}).
			Info("Listeners share a file descriptor budget; a connection past it is refused at accept with that reason.")
		p.budget = b
	})
	return p.budget
}

// warnSessionBudget says once, at start, when the descriptor budget holds
// fewer SSH sessions than the proxy's connection cap: which limit applies
// and how many sessions it allows. Connections past it are refused at
// accept with that reason (limiter.SSHRefusal: the client prints it), not
// left to hang in the backlog or to spin the accept loop on EMFILE.
func (p *Process) warnSessionBudget(b *limiter.Budget) {
	sessions := int64(b.Descriptors() / descriptorsPerProxySession)
	configured := p.cfg.Limits.MaxConnections
	want := int64(configured)
	if configured == 0 {
		want = limiter.DefaultMaxConnections
	}
	if want > 0 && want <= sessions {
		return
	}
	wanted := "no cap (max_connections: -1)"
	if want > 0 {
		wanted = fmt.Sprintf("max_connections %d", want)
	}
	soft, hard, ok := fileLimit()
	if !ok || p.cfg.Limits.MaxDescriptors > 0 {
		p.log.WithFields(logrus.Fields{"max_descriptors": b.Descriptors(), "sessions": sessions, "configured": wanted}).
			Warn(fmt.Sprintf("limits.max_descriptors %d caps this proxy at %d concurrent SSH connections (%d descriptors per forwarded session) instead of %s, less what its other listeners hold.",
				b.Descriptors(), sessions, descriptorsPerProxySession, wanted))
		return
	}
	p.log.WithFields(logrus.Fields{"rlimit_nofile": soft, "hard_limit": hard, "sessions": sessions, "configured": wanted}).
		Warn(fmt.Sprintf("The file descriptor limit caps this proxy at %d concurrent SSH connections (RLIMIT_NOFILE %d, hard %d: "+
			"%d descriptors per forwarded session, %d kept for the rest of the process) instead of %s, less what its other listeners hold; "+
			"connections past it are refused with that reason. Raise the hard limit (LimitNOFILE= in the systemd unit) to hold more.",
			sessions, soft, hard, descriptorsPerProxySession, descriptorReserve, wanted))
}
