package service

import (
	"fmt"
	"net"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/limiter"
)

// capListener puts the connection caps of the config on one listener.
// perIP overrides the per-address cap (negative: none): a node sees every
// proxied session arrive from the proxy's address, so a per-address cap
// there would cap the node, not a client. sshRefusal says whether a refused
// TCP connection gets a one-line reason (SSH allows text before its version
// line; TLS ports do not). withRate adds the new-connection rate per
// address, which bounds handshake work spent on clients reconnecting in a
// loop. The limiter also serves the per-user caps inside the SSH server.
func (p *Process) capListener(name string, ln net.Listener, perIP int, sshRefusal, withRate bool) (net.Listener, *limiter.ConnectionLimiter, error) {
	l := p.cfg.Limits
	if perIP == 0 {
		perIP = l.MaxConnectionsPerIP
	}
	maxConns, maxReason := l.MaxConnections, ""
	if name == ListenerProxySSH {
		maxConns, maxReason = p.descriptorCap(maxConns)
	}
	lim, err := limiter.NewConnectionLimiter(limiter.Config{
		Name:                  name,
		MaxConnections:        maxConns,
		MaxConnectionsReason:  maxReason,
		MaxConnectionsPerIP:   perIP,
		MaxConnectionsPerUser: l.MaxConnectionsPerUser,
		MaxSessionsPerUser:    l.MaxSessionsPerUser,
		Clock:                 p.clock,
		Logger:                p.log.WithField("component", "limiter"),
		Metrics:               p.registry,
	})
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	opts := limiter.ListenerOptions{OnRefuse: p.auditRefusal}
	if sshRefusal {
		opts.Refusal = limiter.SSHRefusal
	}
	if withRate {
		// The real clock: refilling buckets on a test's fake clock would
		// starve every client after the first burst.
		rate, err := limiter.NewRateLimiter(limiter.RateConfig{Name: name, Logger: p.log.WithField("component", "limiter"), Metrics: p.registry})
		if err != nil {
			return nil, nil, trace.Wrap(err)
		}
		opts.Rate = rate
	}
	return limiter.WrapListener(ln, lim, opts), lim, nil
}

// Descriptor budget of the proxy's SSH port. A forwarded session holds two
// descriptors at the proxy (the client's socket and the dial to the node);
// descriptorReserve are kept for everything else the process opens (its
// listeners, the backend, the auth API's and the tunnels' connections,
// logs, web sessions), so that hitting the cap refuses one more client with
// a reason instead of failing an accept, a dial or a backend write with
// EMFILE somewhere else.
const (
	descriptorsPerProxySession = 2
	descriptorReserve          = 256
)

// descriptorCap lowers the proxy SSH port's connection cap (configured:
// max_connections, zero for the default, negative for none) to what the
// process's descriptor limit holds, and says why for the refusal. The
// daemon raised its soft limit to the hard one at start (raiseFileLimit);
// when even that holds fewer sessions than the cap, it logs once which
// limit applies and how many sessions it allows, and connections past it
// are refused at accept with that reason (limiter.SSHRefusal: the client
// prints it), not left to hang in the backlog or to spin the accept loop on
// EMFILE.
func (p *Process) descriptorCap(configured int) (int, string) {
	soft, hard, ok := fileLimit()
	if !ok {
		return configured, ""
	}
	budget := (int64(soft) - descriptorReserve) / descriptorsPerProxySession
	if budget < 1 {
		budget = 1
	}
	want := int64(configured)
	if configured == 0 {
		want = limiter.DefaultMaxConnections
	}
	if want > 0 && want <= budget {
		return configured, ""
	}
	wanted := "no cap (max_connections: -1)"
	if want > 0 {
		wanted = fmt.Sprintf("max_connections %d", want)
	}
	p.log.WithFields(logrus.Fields{"rlimit_nofile": soft, "hard_limit": hard, "sessions": budget, "configured": wanted}).
		Warn(fmt.Sprintf("The file descriptor limit caps this proxy at %d concurrent SSH connections (RLIMIT_NOFILE %d, hard %d: "+
			"%d descriptors per forwarded session, %d kept for the rest of the process) instead of %s; connections past it are refused with that reason. "+
			"Raise the hard limit (LimitNOFILE= in the systemd unit) to hold more.",
			budget, soft, hard, descriptorsPerProxySession, descriptorReserve, wanted))
	return int(budget), fmt.Sprintf("this proxy's file descriptor limit, RLIMIT_NOFILE %d, holds %d sessions", soft, budget)
}
