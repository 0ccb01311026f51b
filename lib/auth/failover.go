package auth

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
)

// Several auth servers: a cluster on etcd runs two or more auth processes
// on one backend, and every client of the auth API (nodes, proxies, pctl,
// a joining host) is given all of their addresses, comma-separated
// ("a:3025,b:3025"). Every auth server holds a certificate for
// AuthServerName from the one cluster CA, so any of them will do.
//
// The Client (authServers below) sends each call to one server, the
// active one, by putting its address in the URL: the transport keeps one
// pool of connections per server, so moving to another server leaves the
// old one's pooled connections unused. It moves on when:
//
//   - connecting fails. Connecting includes the TLS handshake, under a
//     short deadline (DialTimeout): a frozen server (SIGSTOPped, or wedged)
//     still completes TCP handshakes, because the kernel queues them in the
//     listen backlog, so only a handshake that no one answers tells it
//     apart. Nothing was sent, so any call moves to the next server at
//     once.
//   - a call sent on an open connection gets no answer within the call
//     timeout, or its connection breaks: the server froze or went away
//     with the call in flight. It is marked suspect, so that the next
//     calls (and their connections) go to the next server; the call itself
//     is sent again there once if repeating it is harmless (idempotent:
//     reads and the PUTs listed in idempotentPuts, heartbeats among them).
//     Only this one call per frozen server waits out the call timeout:
//     the calls after it go elsewhere. A caller's own deadline counts
//     too: a heartbeat's (its interval) is shorter than the call timeout,
//     so a repeatable call with a deadline gets half of it on the first
//     server, leaving the other half for the next; and a call whose
//     deadline passed unanswered marks its server suspect all the same.
//   - the server answers that it is shutting down (headerGoingAway): its
//     handler did not run, so any call is sent again to the next server.
//
// Fail back: the first address is the preferred one (operators list the
// nearest auth server first, or spread clients by ordering their lists).
// While the client is elsewhere, a call made failbackInterval after it left
// (or after the last probe failed) starts one background probe of the
// preferred server (a ping under the dial deadline); when that answers,
// the next calls go back to it. So a client returns to its preferred
// server at most failbackInterval plus one probe after the server
// recovers, as long as it makes calls (heartbeats do), and no call ever
// waits on a probe.

// failbackInterval is how long a client stays away from its preferred
// auth server before probing it, and between probes while it does not
// answer. Short enough that a recovered server takes its clients back
// within a heartbeat or two, long enough that a flapping one costs
// little: a probe is one connection in the background.
const failbackInterval = 30 * time.Second

// suspectPeriod is how long a server that failed a call is skipped when
// choosing where the next call goes (unless every server is suspect, in
// which case they are all tried in order anyway).
const suspectPeriod = failbackInterval

// headerGoingAway is set on the answer of an auth API server that is
// shutting down and refused to run the call's handler: the client can
// send the call, whatever it is, to another server.
const headerGoingAway = "Postern-Going-Away"

// authServers is a Client's view of its auth servers: which one calls go
// to, which are suspect, and when to probe the preferred one.
type authServers struct {
	addrs []string
	clock clockwork.Clock
	log   logrus.FieldLogger

	// mu guards the fields below.
	mu     sync.Mutex
	active int
	// suspectUntil[i] is when server i stops being suspect.
	suspectUntil []time.Time
	// probeAt is when the preferred server may next be probed (while
	// active is not 0).
	probeAt time.Time
	probing bool
}

func newAuthServers(addrs []string, clock clockwork.Clock, log logrus.FieldLogger) *authServers {
	return &authServers{addrs: addrs, clock: clock, log: log, suspectUntil: make([]time.Time, len(addrs))}
}

// order lists the servers a call may try, best first: the active one,
// then the others after it in list order; servers that are suspect come
// after those that are not.
func (s *authServers) order() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var good, suspect []int
	for i := range s.addrs {
		idx := (s.active + i) % len(s.addrs)
		if now.Before(s.suspectUntil[idx]) {
			suspect = append(suspect, idx)
		} else {
			good = append(good, idx)
		}
	}
	return append(good, suspect...)
}

// current is the server calls go to now.
func (s *authServers) current() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

// suspect marks server idx as failing: the next calls go elsewhere.
func (s *authServers) suspect(idx int, why error) {
	if len(s.addrs) < 2 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	s.suspectUntil[idx] = now.Add(suspectPeriod)
	if idx != s.active {
		return
	}
	next := (idx + 1) % len(s.addrs)
	for i := 1; i < len(s.addrs); i++ {
		cand := (idx + i) % len(s.addrs)
		if !now.Before(s.suspectUntil[cand]) {
			next = cand
			break
		}
	}
	if s.active == 0 {
		s.probeAt = now.Add(failbackInterval)
	}
	s.active = next
	s.log.WithError(why).WithFields(logrus.Fields{"failed": s.addrs[idx], "next": s.addrs[next]}).Warn("Auth server failed a call; moving to the next one.")
}

// answered records that server idx answered a call: when the active one
// is suspect (every server was), calls stay where they succeed.
func (s *authServers) answered(idx int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.suspectUntil[idx] = time.Time{}
	if idx != s.active && s.clock.Now().Before(s.suspectUntil[s.active]) {
		if s.active == 0 {
			s.probeAt = s.clock.Now().Add(failbackInterval)
		}
		s.active = idx
	}
}

// startProbe reports whether a probe of the preferred server is due, and
// if so counts it as running (probeDone ends it).
func (s *authServers) startProbe() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active == 0 || s.probing || s.clock.Now().Before(s.probeAt) {
		return false
	}
	s.probing = true
	return true
}

// probeDone ends a probe: on success calls go back to the preferred
// server, else the next probe is due failbackInterval from now.
func (s *authServers) probeDone(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probing = false
	if err != nil {
		s.probeAt = s.clock.Now().Add(failbackInterval)
		s.log.WithError(err).WithField("preferred", s.addrs[0]).Debug("Preferred auth server still not answering.")
		return
	}
	s.suspectUntil[0] = time.Time{}
	if s.active != 0 {
		s.log.WithFields(logrus.Fields{"preferred": s.addrs[0], "from": s.addrs[s.active]}).Info("Preferred auth server answers again; failing back to it.")
		s.active = 0
	}
}

// dialError is a failure to connect to one auth server (TCP or TLS): the
// call was not sent.
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return unwrapDialError(e.err) }
func (e *dialError) Unwrap() error { return e.err }

// tlsDialer connects to one auth server: TCP, then the TLS handshake, both
// under timeout, so that a server that accepts (or whose kernel accepts)
// but never answers counts as unreachable after timeout, not after the
// call's.
type tlsDialer struct {
	tls     *tls.Config
	timeout time.Duration
}

func (d *tlsDialer) DialTLSContext(ctx context.Context, network, addr string) (net.Conn, error) {
	// I/O deadlines are real time, like the call timeout: a fake clock
	// would never fire them.
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	nd := net.Dialer{KeepAlive: 30 * time.Second}
	raw, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, &dialError{addr: addr, err: err}
	}
	tc := tls.Client(raw, d.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		if ctx.Err() == context.DeadlineExceeded {
			err = trace.ConnectionProblem(err, "%s: no TLS handshake within %v (the auth server is not answering)", addr, d.timeout)
		}
		return nil, &dialError{addr: addr, err: err}
	}
	return tc, nil
}

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

// DialRelay connects to an auth server for a byte stream relayed on behalf
// of another host (a tunnel node's auth calls through this proxy). The TLS
// inside is that host's, so nothing here would see a frozen server (one
// that accepts TCP and never answers) swallow every relayed connection,
// and the host behind the relay cannot pick another server itself. So the
// servers are tried in this client's own order (the one its calls go to
// first, suspects last), and each, before it is handed out, must complete
// a TLS handshake of this client's own under DialTimeout; one that does
// not is marked suspect (this client's calls move too) and the next is
// tried. The check costs one extra handshake per relayed connection, and
// relayed connections are pooled by the host.
func (c *Client) DialRelay(ctx context.Context) (net.Conn, error) {
	if c.relay != nil {
		conn, err := c.relay(ctx)
		return conn, trace.Wrap(err)
	}
	if c.cfg.Dial != nil {
		return nil, trace.BadParameter("auth client: DialRelay on a client that itself dials through a relay")
	}
	d := &tlsDialer{tls: c.tlsCfg, timeout: c.cfg.DialTimeout}
	var errs []string
	for _, idx := range c.servers.order() {
		addr := c.servers.addrs[idx]
		conn, err := c.dialLive(ctx, d, addr)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, trace.Wrap(err)
		}
		c.servers.suspect(idx, err)
		errs = append(errs, err.Error())
	}
	return nil, trace.ConnectionProblem(nil, "no auth server reachable: %s", strings.Join(errs, "; "))
}

// dialLive checks that addr completes a TLS handshake, then opens the raw
// connection to relay.
func (c *Client) dialLive(ctx context.Context, d *tlsDialer, addr string) (net.Conn, error) {
	probe, err := d.DialTLSContext(ctx, "tcp", addr)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	probe.Close()
	nd := net.Dialer{Timeout: d.timeout, KeepAlive: 30 * time.Second}
	conn, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "%s", unwrapDialError(err))
	}
	return conn, nil
}
