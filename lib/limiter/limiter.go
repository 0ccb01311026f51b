// Package limiter holds Postern's connection caps and rate limits: the
// bounds that keep one source address, one user or one forwarded port from
// spending the descriptors, memory and CPU that every other user, and the
// process's own work (the backend, the NodeWatcher's watch, the auth API),
// depend on.
//
// A cap counts what is open right now (Acquire returns a release func); a
// rate limit (RateLimiter) counts how fast new things start. Both refuse with
// trace.LimitExceeded and a reason a person can act on ("too many
// connections from 192.0.2.7: limit 250"), and both count every refusal in
// Prometheus, because a cap that trips silently is indistinguishable from an
// outage.
//
// What is refused where (the wiring lives in lib/service and lib/srv):
//   - per source address: at accept, before any handshake (WrapListener),
//     so an unauthenticated flood costs one accept and one close each;
//   - per user and per user's sessions: after authentication, where the user
//     is known; the refusal is an SSH channel open failure or an HTTP 429
//     with the reason, never a hang;
//   - per forwarded port: when a -L/-R forward or a proxied dial opens a new
//     connection (AcquireForward).
//
// The failure of accounting is never the failure of the caller: every map
// entry is removed when its count returns to zero, so memory is bounded by
// what is open at once, which the caps themselves bound.
package limiter

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/observe"
)

// Defaults. The numbers are budgets of file descriptors and memory: each
// proxied connection costs two descriptors (the client's socket and the dial
// to the node) and roughly 100 kB (x/crypto/ssh buffers plus two 32 KiB
// splice buffers while data moves). Go raises the soft RLIMIT_NOFILE to the
// hard limit at start-up, which under systemd is 524288 and under the usual
// container runtimes 1048576; the budgets below assume a conservative 65536.
const (
	// DefaultMaxConnections bounds everything one listener holds open:
	// 10000 connections spend 20000 descriptors (under a third of 65536,
	// leaving the backend, the auth API and log files untouched) and about
	// 1 GB of memory at worst. It is the only cap a flood from many
	// addresses meets, so it is the one that protects the process.
	DefaultMaxConnections = 10000
	// DefaultMaxConnectionsPerIP bounds one source address. 250 leaves room
	// for a CI runner or an office NAT running Ansible with a couple of
	// hundred forks through one address, while one misbehaving host (a
	// reconnect loop, a half-open flood) can spend at most 2.5% of the
	// listener's cap. It applies before authentication, so it is what keeps
	// unauthenticated clients from holding handshakes open: each costs a
	// descriptor for up to the SSH handshake timeout.
	//
	// Everything behind one address shares this cap: a load balancer or
	// ssh-in-a-loop benchmark on 127.0.0.1 needs it raised in the config.
	DefaultMaxConnectionsPerIP = 250
	// DefaultMaxConnectionsPerUser bounds one user's authenticated
	// connections across all addresses: the same fan-out as per address,
	// so a stolen certificate used from a botnet spends no more than one
	// busy automation host would.
	DefaultMaxConnectionsPerUser = 250
	// DefaultMaxSessionsPerUser bounds one user's concurrent session
	// channels (shells, exec, proxy subsystem dials) across all of their
	// connections. A connection's channel count is otherwise unbounded
	// (OpenSSH multiplexing with ControlMaster puts up to 10 on one), and
	// on the proxy every session is a dial, so a descriptor: 500 is two per
	// connection at the connection cap.
	DefaultMaxSessionsPerUser = 500
	// DefaultMaxConnectionsPerForward bounds one forwarded port (one -L
	// target or one -R listener of one connection): 256 connections at once
	// is far more than a service behind a forward meets in real use, and a
	// forward at its cap spends 512 descriptors, so a node can carry dozens
	// of saturated forwards and keep its own descriptors untouched.
	DefaultMaxConnectionsPerForward = 256
	// DefaultMaxHandshakes bounds the connections one listener holds in
	// their handshake (accepted, not yet authenticated) across all
	// addresses, on listeners that count handshakes
	// (ListenerOptions.Handshakes: the tunnel and peer ports). It is
	// OpenSSH's MaxStartups for ports whose clients are machines: a
	// handshake takes milliseconds, so 500 at once is a reconnect storm
	// of thousands of nodes served in waves (the refused retry with
	// back-off), and all a credential-less flood from any number of
	// addresses can hold is 500 descriptors for one handshake timeout,
	// far below the descriptor budget the other ports need.
	DefaultMaxHandshakes = 500
	// DefaultMaxHandshakesPerIP bounds one address's connections in their
	// handshake: a site of nodes behind one NAT reconnecting at once, a
	// few dozen at a time, while one misbehaving host holds at most a
	// tenth of DefaultMaxHandshakes.
	DefaultMaxHandshakesPerIP = 50
)

// Cap names, the `cap` label of the refusal counter.
const (
	CapConnections = "connections"
	CapIP          = "ip"
	CapUser        = "user"
	CapSessions    = "sessions"
	CapForward     = "forward"
	CapRate        = "rate"
	// CapDescriptors is the process's shared descriptor budget (Budget).
	CapDescriptors = "descriptors"
	// CapHandshakes is the cap on connections still in their handshake.
	CapHandshakes = "handshakes"
)

// refusalLogInterval is how often a refusal of one cap is logged at Warn:
// the first refusal of a streak tells the operator at once, and a flood then
// costs one line a minute (with the count refused meanwhile) instead of one
// line per connection. Every refusal is still logged at Debug and counted.
const refusalLogInterval = time.Minute

// Config configures a ConnectionLimiter. For each cap, zero means its
// default and a negative value means no cap.
type Config struct {
	// Name labels this limiter's metrics (`listener`) and logs: "proxy_ssh",
	// "node", "web". Default "default".
	Name string
	// MaxConnections caps connections held through the limiter in total.
	MaxConnections int
	// MaxConnectionsReason, when set, says in the refusal why
	// MaxConnections is what it is (the daemon lowers it to what its file
	// descriptor limit holds), so that a refused client and the operator
	// learn which limit to raise.
	MaxConnectionsReason string
	// MaxConnectionsPerIP caps concurrent connections from one source
	// address (IPv4 address, or IPv6 /64: see ipKey).
	MaxConnectionsPerIP int
	// MaxConnectionsPerUser caps one user's concurrent authenticated
	// connections.
	MaxConnectionsPerUser int
	// MaxSessionsPerUser caps one user's concurrent sessions.
	MaxSessionsPerUser int
	// MaxConnectionsPerForward caps concurrent connections on one forwarded
	// port.
	MaxConnectionsPerForward int
	// MaxHandshakes and MaxHandshakesPerIP cap connections in their
	// handshake, in total and per source address, on a listener wrapped
	// with ListenerOptions.Handshakes (elsewhere they are not counted). A
	// connection counts from accept until HandshakeDone or its Close.
	MaxHandshakes      int
	MaxHandshakesPerIP int
	// Budget, when set, is the process's descriptor budget, shared with
	// its other listeners: every connection accepted here also spends
	// DescriptorsPerConn of it until it closes, and is refused when the
	// budget cannot hold it. Nil: no budget.
	Budget *Budget
	// DescriptorsPerConn is what one connection here costs the process:
	// 1 for its socket, 2 where every connection dials on (a proxied SSH
	// session: the client's socket and the node's). Zero means 1.
	DescriptorsPerConn int
	// Deps: Clock times the Warn-level refusal log; Metrics is where the
	// counters are registered (several limiters may share one registry:
	// they share the series, told apart by the `listener` label). Zero
	// fields get observe's defaults.
	observe.Deps
}

// CheckAndSetDefaults fills in defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.Name == "" {
		c.Name = "default"
	}
	c.MaxConnections = orDefault(c.MaxConnections, DefaultMaxConnections)
	c.MaxConnectionsPerIP = orDefault(c.MaxConnectionsPerIP, DefaultMaxConnectionsPerIP)
	c.MaxConnectionsPerUser = orDefault(c.MaxConnectionsPerUser, DefaultMaxConnectionsPerUser)
	c.MaxSessionsPerUser = orDefault(c.MaxSessionsPerUser, DefaultMaxSessionsPerUser)
	c.MaxConnectionsPerForward = orDefault(c.MaxConnectionsPerForward, DefaultMaxConnectionsPerForward)
	c.MaxHandshakes = orDefault(c.MaxHandshakes, DefaultMaxHandshakes)
	c.MaxHandshakesPerIP = orDefault(c.MaxHandshakesPerIP, DefaultMaxHandshakesPerIP)
	if c.DescriptorsPerConn < 0 {
		return trace.BadParameter("limiter: negative DescriptorsPerConn %d", c.DescriptorsPerConn)
	}
	if c.DescriptorsPerConn == 0 {
		c.DescriptorsPerConn = 1
	}
	c.Deps.SetDefaults(observe.ComponentLimiter)
	return nil
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// ConnectionLimiter counts what is open per key and refuses past each cap.
// It is safe for concurrent use.
type ConnectionLimiter struct {
	cfg     Config
	log     logrus.FieldLogger
	metrics *metrics

	// mu guards every map and warn below; nothing blocks while holding it.
	mu       sync.Mutex
	total    int
	ips      map[string]int
	users    map[string]int
	sessions map[string]int
	forwards map[string]int
	// handshakes and hsIPs count connections in their handshake, in
	// total and per address key.
	handshakes int
	hsIPs      map[string]int
	warns      map[string]*warnState
}

// warnState throttles the Warn log of one cap.
type warnState struct {
	last       time.Time
	suppressed int
}

// NewConnectionLimiter creates a limiter.
func NewConnectionLimiter(cfg Config) (*ConnectionLimiter, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &ConnectionLimiter{
		cfg:      cfg,
		log:      cfg.Logger.WithField("listener", cfg.Name),
		metrics:  m,
		ips:      map[string]int{},
		users:    map[string]int{},
		sessions: map[string]int{},
		forwards: map[string]int{},
		hsIPs:    map[string]int{},
		warns:    map[string]*warnState{},
	}, nil
}

// Name is the limiter's Config.Name.
func (l *ConnectionLimiter) Name() string { return l.cfg.Name }

// AcquireIP counts one connection from addr against the per-address cap and
// the limiter's total cap. On success the returned release must be called
// exactly once when the connection ends (calling it again is harmless). An
// address that is not TCP/UDP/IP (a unix socket, an in-memory pipe) counts
// only against the total: there is no remote host to hold responsible.
func (l *ConnectionLimiter) AcquireIP(addr net.Addr) (release func(), err error) {
	release, _, err = l.acquireIP(addr)
	return release, err
}

// acquireIP is AcquireIP that also names the cap that refused.
func (l *ConnectionLimiter) acquireIP(addr net.Addr) (release func(), capName string, err error) {
	key, display := ipKey(addr)
	l.mu.Lock()
	if max := l.cfg.MaxConnections; max > 0 && l.total >= max {
		l.mu.Unlock()
		if why := l.cfg.MaxConnectionsReason; why != "" {
			return nil, CapConnections, l.refuse(CapConnections, "", trace.LimitExceeded(
				"too many connections to %s: limit %d (%s)", l.cfg.Name, max, why))
		}
		return nil, CapConnections, l.refuse(CapConnections, "", trace.LimitExceeded(
			"too many connections to %s: limit %d", l.cfg.Name, max))
	}
	if key != "" {
		if max := l.cfg.MaxConnectionsPerIP; max > 0 && l.ips[key] >= max {
			l.mu.Unlock()
			return nil, CapIP, l.refuse(CapIP, display, trace.LimitExceeded(
				"too many connections from %s: limit %d", display, max))
		}
	}
	cost := l.cfg.DescriptorsPerConn
	if b := l.cfg.Budget; b != nil && !b.take(cost) {
		l.mu.Unlock()
		return nil, CapDescriptors, l.refuse(CapDescriptors, "", b.refusal(l.cfg.Name, cost))
	}
	if key != "" {
		l.ips[key]++
	}
	l.total++
	l.mu.Unlock()
	l.metrics.active.WithLabelValues(l.cfg.Name, CapConnections).Inc()
	return l.once(func() {
		l.mu.Lock()
		l.total--
		if key != "" {
			decrement(l.ips, key)
		}
		l.mu.Unlock()
		if b := l.cfg.Budget; b != nil {
			b.give(cost)
		}
		l.metrics.active.WithLabelValues(l.cfg.Name, CapConnections).Dec()
	}), "", nil
}

// acquireHandshake counts one connection from addr in its handshake
// against MaxHandshakes and MaxHandshakesPerIP (see Config).
func (l *ConnectionLimiter) acquireHandshake(addr net.Addr) (release func(), err error) {
	key, display := ipKey(addr)
	l.mu.Lock()
	if max := l.cfg.MaxHandshakes; max > 0 && l.handshakes >= max {
		l.mu.Unlock()
		return nil, l.refuse(CapHandshakes, "", trace.LimitExceeded(
			"too many connections in their handshake on %s: limit %d", l.cfg.Name, max))
	}
	if key != "" {
		if max := l.cfg.MaxHandshakesPerIP; max > 0 && l.hsIPs[key] >= max {
			l.mu.Unlock()
			return nil, l.refuse(CapHandshakes, display, trace.LimitExceeded(
				"too many connections in their handshake from %s: limit %d", display, max))
		}
		l.hsIPs[key]++
	}
	l.handshakes++
	l.mu.Unlock()
	l.metrics.active.WithLabelValues(l.cfg.Name, CapHandshakes).Inc()
	return l.once(func() {
		l.mu.Lock()
		l.handshakes--
		if key != "" {
			decrement(l.hsIPs, key)
		}
		l.mu.Unlock()
		l.metrics.active.WithLabelValues(l.cfg.Name, CapHandshakes).Dec()
	}), nil
}

// AcquireUser counts one authenticated connection of user.
func (l *ConnectionLimiter) AcquireUser(user string) (release func(), err error) {
	return l.acquire(l.users, user, l.cfg.MaxConnectionsPerUser, CapUser,
		"too many connections for user %q: limit %d")
}

// AcquireSession counts one session of user.
func (l *ConnectionLimiter) AcquireSession(user string) (release func(), err error) {
	return l.acquire(l.sessions, user, l.cfg.MaxSessionsPerUser, CapSessions,
		"too many sessions for user %q: limit %d")
}

// AcquireForward counts one connection on a forwarded port. key names the
// forward and is chosen by the caller so that it is unique to what it caps,
// e.g. "CONN_ID/-R/127.0.0.1:8080" for one connection's -R listener or
// "CONN_ID/-L/db:5432" for its direct-tcpip target.
func (l *ConnectionLimiter) AcquireForward(key string) (release func(), err error) {
	return l.acquire(l.forwards, key, l.cfg.MaxConnectionsPerForward, CapForward,
		"too many connections on forwarded port %s: limit %d")
}

// Count reports what is open now: the total, and per key for the given cap
// (CapIP takes an address string such as "192.0.2.7" or "192.0.2.7:22";
// CapHandshakes one too, or "" for the listener's total).
// Meant for tests and diagnostics.
func (l *ConnectionLimiter) Count(capName, key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch capName {
	case CapConnections:
		return l.total
	case CapIP:
		k, _ := ipKey(stringAddr(key))
		return l.ips[k]
	case CapUser:
		return l.users[key]
	case CapSessions:
		return l.sessions[key]
	case CapForward:
		return l.forwards[key]
	case CapHandshakes:
		if key == "" {
			return l.handshakes
		}
		k, _ := ipKey(stringAddr(key))
		return l.hsIPs[k]
	}
	return 0
}

func (l *ConnectionLimiter) acquire(m map[string]int, key string, max int, capName, format string) (func(), error) {
	l.mu.Lock()
	if max > 0 && m[key] >= max {
		l.mu.Unlock()
		return nil, l.refuse(capName, key, trace.LimitExceeded(format, key, max))
	}
	m[key]++
	l.mu.Unlock()
	l.metrics.active.WithLabelValues(l.cfg.Name, capName).Inc()
	return l.once(func() {
		l.mu.Lock()
		decrement(m, key)
		l.mu.Unlock()
		l.metrics.active.WithLabelValues(l.cfg.Name, capName).Dec()
	}), nil
}

// once makes a release idempotent: a deferred release plus an explicit one
// on an early path must not free someone else's slot.
func (l *ConnectionLimiter) once(f func()) func() {
	var o sync.Once
	return func() { o.Do(f) }
}

// decrement removes entries at zero, which is what bounds the maps by the
// number of open connections.
func decrement(m map[string]int, key string) {
	if m[key] <= 1 {
		delete(m, key)
		return
	}
	m[key]--
}

// refuse counts and logs a refusal and returns err.
func (l *ConnectionLimiter) refuse(capName, key string, err error) error {
	l.metrics.refusals.WithLabelValues(l.cfg.Name, capName).Inc()
	log := l.log.WithFields(logrus.Fields{"cap": capName, "key": key})
	log.WithError(err).Debug("Refused: limit reached.")
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	w := l.warns[capName]
	if w == nil {
		w = &warnState{}
		l.warns[capName] = w
	}
	warn := w.last.IsZero() || now.Sub(w.last) >= refusalLogInterval
	suppressed := w.suppressed
	if warn {
		w.last, w.suppressed = now, 0
	} else {
		w.suppressed++
	}
	l.mu.Unlock()
	if warn {
		log.WithField("refused_since_last_warning", suppressed).Warn(
			fmt.Sprintf("Connection limit reached, refusing: %v.", err))
	}
	return err
}

// ipKey returns the counting key of addr and how to show it. IPv6 clients
// are counted per /64: one subscriber or one cloud instance is normally
// handed a whole /64, so counting single addresses would let one host
// rotate through 2^64 of them and never meet its cap.
func ipKey(addr net.Addr) (key, display string) {
	var ip net.IP
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip = a.IP
	case *net.UDPAddr:
		ip = a.IP
	case *net.IPAddr:
		ip = a.IP
	case nil:
		return "", ""
	default:
		host := a.String()
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		ip = net.ParseIP(host)
	}
	if ip == nil {
		return "", ""
	}
	if v4 := ip.To4(); v4 != nil {
		s := v4.String()
		return s, s
	}
	n := &net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}
	s := n.String()
	return s, s
}

// stringAddr is a net.Addr from a string, for Count and HTTP remote
// addresses.
type stringAddr string

func (s stringAddr) Network() string { return "tcp" }
func (s stringAddr) String() string  { return string(s) }
