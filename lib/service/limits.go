package service

import (
	"net"

	"github.com/gravitational/trace"

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
	lim, err := limiter.NewConnectionLimiter(limiter.Config{
		Name:                  name,
		MaxConnections:        l.MaxConnections,
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
