package health

// One check of one node, usable on its own (`pctl` may check a server
// before registering it): connect, read the identification string, verify
// the host certificate, hang up.

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/sshalgo"
)

// CheckRequest is one check of one node.
type CheckRequest struct {
	// Node is the node checked: its Addr is dialed, and its host
	// certificate must name its Hostname.
	Node services.Node
	// HostCAs are the keys its host certificate may be signed by.
	HostCAs []ssh.PublicKey
	// Dialer; nil means a net.Dialer.
	Dialer Dialer
	// Clock is the time the certificate must be valid at; nil means the
	// real clock.
	Clock clockwork.Clock
	// Timeout bounds the whole check; zero means DefaultTimeout.
	Timeout time.Duration
}

// errVerified ends a check's handshake once the host key passed: nothing
// after it (user authentication) tells more about the server's health.
var errVerified = errors.New("host certificate verified")

// Check connects to req.Node and verifies its SSH identification string
// and host certificate, then hangs up. nil: the node answers as itself.
// The error says what failed, in words for `pctl nodes ls` and the logs.
func Check(ctx context.Context, req CheckRequest) error {
	if req.Dialer == nil {
		req.Dialer = &net.Dialer{}
	}
	if req.Clock == nil {
		req.Clock = clockwork.NewRealClock()
	}
	if req.Timeout <= 0 {
		req.Timeout = DefaultTimeout
	}
	// Real time on purpose, as for the Router's node dials: it bounds a
	// kernel connect() and reads, which a fake clock cannot speed up.
	ctx, cancel := context.WithTimeout(ctx, req.Timeout)
	defer cancel()
	n := req.Node
	conn, err := req.Dialer.DialContext(ctx, "tcp", n.Addr)
	if err != nil {
		return trace.ConnectionProblem(err, "connecting to %s: %v", n.Addr, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	var hostErr error
	cfg := sshalgo.Defaults().ClientConfig(&ssh.ClientConfig{
		User:          "postern-health-check",
		ClientVersion: "SSH-2.0-Postern-health-check",
		// Certificates only: a server without one is not set up for
		// Postern, and must not be called online.
		HostKeyAlgorithms: sshalgo.HostKeyAlgorithms(),
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			if err := authz.CheckHostCert(req.HostCAs, n.Hostname, key, req.Clock); err != nil {
				hostErr = err
				return err
			}
			return errVerified
		},
	})
	client, chans, reqs, err := ssh.NewClientConn(conn, n.Addr, cfg)
	if err == nil {
		// Unreachable (the host key callback never lets a handshake
		// finish), but a connection is never left open.
		go ssh.DiscardRequests(reqs)
		go func() {
			for ch := range chans {
				ch.Reject(ssh.Prohibited, "health check")
			}
		}()
		client.Close()
		return nil
	}
	switch {
	case errors.Is(err, errVerified):
		return nil
	case hostErr != nil:
		return trace.AccessDenied("%s: %v", n.Addr, trace.UserMessage(hostErr))
	case ctx.Err() != nil:
		return trace.ConnectionProblem(err, "%s: no SSH answer within %v", n.Addr, req.Timeout)
	case strings.Contains(err.Error(), "no common algorithm for host key"):
		return trace.AccessDenied("%s: the server offers no host certificate", n.Addr)
	}
	return trace.ConnectionProblem(err, "%s: SSH handshake: %v", n.Addr, err)
}
