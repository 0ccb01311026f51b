package proxy

import (
	"net"
	"time"
)

// Defaults of the proxy -> node leg's liveness checks. The proxy only
// splices bytes on this leg (direct-tcpip and the proxy: subsystem carry
// the user's own SSH connection), so SSH keep-alives are not available to
// it; TCP has to notice a node that vanished.
const (
	// DefaultKeepAliveIdle, Interval and Count: a silent connection is
	// probed after 10s and dropped after 3 unanswered probes 5s apart, so
	// a node that vanished from the network is noticed within ~25s.
	DefaultKeepAliveIdle     = 10 * time.Second
	DefaultKeepAliveInterval = 5 * time.Second
	DefaultKeepAliveCount    = 3
	// DefaultTCPUserTimeout fails a connection whose sent data stays
	// unacknowledged (or cannot be sent into a zero window) for 30s: a
	// frozen node (SIGSTOP, a paused VM) whose kernel still answers
	// keep-alive probes but whose process reads nothing.
	DefaultTCPUserTimeout = 30 * time.Second
)

// newNodeDialer returns the dialer of the proxy -> node leg.
func newNodeDialer(ka net.KeepAliveConfig, userTimeout time.Duration) *net.Dialer {
	return &net.Dialer{KeepAliveConfig: ka, Control: userTimeoutControl(userTimeout)}
}
