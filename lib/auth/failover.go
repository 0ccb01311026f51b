package auth

import (
	"context"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
)

// Several auth servers: a cluster on etcd runs two or more auth processes
// on one backend, and every client of the auth API (nodes, proxies, pctl,
// a joining host) is given all of their addresses, comma-separated
// ("a:3025,b:3025"). The failover is in the dialer: each new connection
// goes to the server that answered last, and to the next one in the list
// when that one cannot be dialed, so pooled connections, watches and the
// TLS check are untouched (every auth server holds a certificate for
// AuthServerName from the one cluster CA). A call in flight on a server
// that dies fails like any call on a broken connection; the next call
// dials the next server.

// SplitAuthAddrs splits a comma-separated list of auth API addresses.
func SplitAuthAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// maxFailoverDialTimeout bounds one address's dial when there are others
// to try: a dead host that drops SYNs must not hold the call for the
// whole call timeout before the next server is tried.
const maxFailoverDialTimeout = 5 * time.Second

// failoverDialer dials the first reachable address of a list, starting
// with the last one that worked.
type failoverDialer struct {
	addrs   []string
	timeout time.Duration

	// mu guards next.
	mu   sync.Mutex
	next int
}

func newFailoverDialer(addrs []string, timeout time.Duration) *failoverDialer {
	if len(addrs) > 1 && timeout > maxFailoverDialTimeout {
		timeout = maxFailoverDialTimeout
	}
	return &failoverDialer{addrs: addrs, timeout: timeout}
}

// DialContext ignores addr (the transport's one pool key) and dials the
// list.
func (d *failoverDialer) DialContext(ctx context.Context, network, _ string) (net.Conn, error) {
	d.mu.Lock()
	start := d.next
	d.mu.Unlock()
	var errs []string
	for i := 0; i < len(d.addrs); i++ {
		idx := (start + i) % len(d.addrs)
		addr := d.addrs[idx]
		nd := net.Dialer{Timeout: d.timeout, KeepAlive: 30 * time.Second}
		conn, err := nd.DialContext(ctx, network, addr)
		if err == nil {
			d.mu.Lock()
			d.next = idx
			d.mu.Unlock()
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, trace.Wrap(err)
		}
		errs = append(errs, unwrapDialError(err))
	}
	if len(d.addrs) == 1 {
		return nil, trace.ConnectionProblem(nil, "%s", errs[0])
	}
	return nil, trace.ConnectionProblem(nil, "no auth server reachable: %s", strings.Join(errs, "; "))
}

func unwrapDialError(err error) string {
	if oe, ok := err.(*net.OpError); ok && oe.Err != nil {
		return oe.Addr.String() + ": " + oe.Err.Error()
	}
	return err.Error()
}

// DialAny dials the first reachable of a comma-separated list of auth API
// addresses, for what splices raw bytes to auth (a tunnel node's auth
// calls, the join relay).
func DialAny(ctx context.Context, addrs string) (net.Conn, error) {
	list := SplitAuthAddrs(addrs)
	if len(list) == 0 {
		return nil, trace.NotFound("no auth server address")
	}
	return newFailoverDialer(list, maxFailoverDialTimeout).DialContext(ctx, "tcp", "")
}
