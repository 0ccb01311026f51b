// Package health tells the proxy whether the OpenSSH servers in its
// inventory (nodes of kind openssh) answer. Such a server runs nothing of
// Postern: it never heartbeats, so its record never expires, and without
// a check the Router would keep sending users to a host that is gone.
//
// Each proxy runs one Checker. A check is what a client of the node
// would see first: a TCP connection to the registered address, the
// server's SSH identification string, and a host certificate signed by
// the cluster's host CA naming the node. The handshake stops right after
// the host key is verified: nothing authenticates, so the node's sshd
// logs a pre-authentication disconnect and no failed login.
//
// A node that answers is checked again every Interval; one that does not
// is retried with an exponential backoff (MinBackoff doubling up to
// MaxBackoff), so a host down for maintenance costs each proxy one
// connection attempt per MaxBackoff, and one that comes back is seen
// within MaxBackoff.
package health

import (
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backoff"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// NodeLister lists the OpenSSH nodes of a cluster; *services.NodeWatcher
// is the production one.
type NodeLister interface {
	OpenSSHNodes(ctx context.Context, cluster string) ([]services.Node, error)
}

// CAGetter reads a cluster's certificate authorities (public keys are
// enough); the auth client and *services.Store are ones.
type CAGetter interface {
	GetCertAuthority(ctx context.Context, clusterName string, t services.CertAuthType, withSecrets bool) (*services.CertAuthority, error)
}

// Dialer opens the TCP connection to a node; *net.Dialer is one.
type Dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

var (
	_ NodeLister = (*services.NodeWatcher)(nil)
	_ CAGetter   = (*services.Store)(nil)
	_ Dialer     = (*net.Dialer)(nil)
)

// Defaults.
const (
	// DefaultInterval is how often a node that answered is checked again:
	// how long a proxy may go on sending users to a server that died.
	DefaultInterval = 10 * time.Second
	// DefaultMinBackoff is the first retry of a node that did not answer.
	DefaultMinBackoff = 2 * time.Second
	// DefaultMaxBackoff caps the retries of a node that stays down.
	DefaultMaxBackoff = 30 * time.Second
	// DefaultTimeout bounds one check (connect, identification string,
	// key exchange up to the host key): an sshd on a LAN answers in
	// milliseconds.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxConcurrent bounds the checks in flight: a proxy must not
	// open hundreds of connections at once after a restart.
	DefaultMaxConcurrent = 16
	// tick is how often the loop looks for nodes due for a check (new
	// ones included): the resolution of every interval above.
	tick = time.Second
)

// Config configures a Checker.
type Config struct {
	// ClusterName is the cluster whose OpenSSH nodes are checked, and
	// whose host CA must have signed their host certificates. Required.
	ClusterName string
	// Nodes lists the nodes to check. Required.
	Nodes NodeLister
	// CAs supplies the cluster's host CA, read every round that has a
	// node due (at most once per second) so that a CA rotation applies
	// without a restart: give it the proxy's in-memory access cache, not
	// an auth API client. Required.
	CAs CAGetter
	// Dialer; nil means a net.Dialer.
	Dialer Dialer
	// Interval, MinBackoff, MaxBackoff, Timeout, MaxConcurrent: zero
	// means the Default of the same name.
	Interval      time.Duration
	MinBackoff    time.Duration
	MaxBackoff    time.Duration
	Timeout       time.Duration
	MaxConcurrent int
	// Deps: Clock schedules checks and backoffs and is the time
	// certificates are checked against; Logger. Zero fields get
	// observe's defaults.
	observe.Deps
}

// CheckAndSetDefaults validates the config and fills in defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.ClusterName == "" {
		return trace.BadParameter("health checker: missing ClusterName")
	}
	if c.Nodes == nil {
		return trace.BadParameter("health checker: missing Nodes")
	}
	if c.CAs == nil {
		return trace.BadParameter("health checker: missing CAs")
	}
	if c.Dialer == nil {
		c.Dialer = &net.Dialer{}
	}
	c.Deps.SetDefaults(observe.ComponentHealth)
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		return trace.BadParameter("health checker: MaxBackoff %v is below MinBackoff %v", c.MaxBackoff, c.MinBackoff)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	return nil
}

// Status is what the last check of a node found.
type Status struct {
	// Online: the node answered with a valid host certificate.
	Online bool
	// Checked is when the last check ended (on the Checker's clock).
	Checked time.Time
	// Error says why the node is offline; empty when online.
	Error string
	// Failures counts the checks failed in a row.
	Failures int
}

// nodeState is one node's schedule and last answer.
type nodeState struct {
	// addr is the address checked: a record moved to another address is
	// checked afresh.
	addr     string
	status   Status
	checked  bool
	next     time.Time
	inFlight bool
	backoff  backoff.Backoff
}

// Checker health-checks the OpenSSH nodes of one cluster. It is safe for
// concurrent use; New starts its loop and Close stops it.
type Checker struct {
	cfg Config

	// mu guards nodes and updated. Never held across a network call.
	mu    sync.Mutex
	nodes map[string]*nodeState
	// updated is closed (and replaced) whenever a check ends.
	updated chan struct{}

	cancel context.CancelFunc
	// wg counts the loop and the checks in flight.
	wg   sync.WaitGroup
	done chan struct{}
}

// New returns a running Checker. The proxy wires it into the Router
// (RouterConfig.Health) and closes it on shutdown.
func New(cfg Config) (*Checker, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	// The checker owns its probes (Close ends them): no caller's context.
	ctx, cancel := context.WithCancel(context.Background())
	c := &Checker{
		cfg:     cfg,
		nodes:   map[string]*nodeState{},
		updated: make(chan struct{}),
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	c.wg.Add(1)
	go c.loop(ctx)
	go func() {
		c.wg.Wait()
		close(c.done)
	}()
	return c, nil
}

// Close stops the loop and waits for the checks in flight (each bounded
// by Timeout, and canceled).
func (c *Checker) Close() error {
	c.cancel()
	<-c.done
	return nil
}

// Done is closed once the Checker has stopped.
func (c *Checker) Done() <-chan struct{} { return c.done }

// Online reports whether node uuid may be dialed. A node not checked yet
// counts as online: a proxy that just started must not refuse every
// OpenSSH node until its first round ends, and a dial to a dead one fails
// on its own (ssh_dial_timeout, then the SSH banner check).
func (c *Checker) Online(uuid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.nodes[uuid]
	return s == nil || !s.checked || s.status.Online
}

// Status returns the last check's answer for node uuid; false when it
// was not checked yet (or is not an OpenSSH node of this cluster).
func (c *Checker) Status(uuid string) (Status, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.nodes[uuid]
	if s == nil || !s.checked {
		return Status{}, false
	}
	return s.status, true
}

// Offline lists the nodes whose last check failed, sorted (the proxy's
// heartbeat reports them, for pctl nodes ls).
func (c *Checker) Offline() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id, s := range c.nodes {
		if s.checked && !s.status.Online {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Updated is closed when the next check ends, whatever it found: for
// callers that wait for a node's status to change (pctl, tests) without
// polling.
func (c *Checker) Updated() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.updated
}

func (c *Checker) loop(ctx context.Context) {
	defer c.wg.Done()
	t := c.cfg.Clock.NewTicker(tick)
	defer t.Stop()
	sem := make(chan struct{}, c.cfg.MaxConcurrent)
	for {
		c.round(ctx, sem)
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
	}
}

// round starts a check of every node that is due and forgets the nodes
// no longer in the inventory.
func (c *Checker) round(ctx context.Context, sem chan struct{}) {
	nodes, err := c.cfg.Nodes.OpenSSHNodes(ctx, c.cfg.ClusterName)
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Logger.WithError(err).Warn("Cannot list OpenSSH nodes; their health is not checked this round.")
		}
		return
	}
	now := c.cfg.Clock.Now()
	var due []services.Node
	c.mu.Lock()
	live := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		live[n.UUID] = true
		s := c.nodes[n.UUID]
		if s == nil || s.addr != n.Addr {
			s = &nodeState{addr: n.Addr, backoff: backoff.Backoff{Min: c.cfg.MinBackoff, Max: c.cfg.MaxBackoff}}
			c.nodes[n.UUID] = s
		}
		if !s.inFlight && !now.Before(s.next) {
			s.inFlight = true
			due = append(due, n)
		}
	}
	for uuid, s := range c.nodes {
		if !live[uuid] && !s.inFlight {
			delete(c.nodes, uuid)
		}
	}
	c.mu.Unlock()
	if len(due) == 0 {
		return
	}
	cas, err := c.hostCAs(ctx)
	if err != nil {
		// Nothing can be verified without the CA: leave every status as
		// it was rather than call the fleet offline.
		if ctx.Err() == nil {
			c.cfg.Logger.WithError(err).Warn("Cannot read the host CA; OpenSSH nodes are not checked this round.")
		}
		c.mu.Lock()
		for _, n := range due {
			if s := c.nodes[n.UUID]; s != nil {
				s.inFlight = false
			}
		}
		c.mu.Unlock()
		return
	}
	for _, n := range due {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer func() { <-sem }()
			err := Check(ctx, CheckRequest{Node: n, HostCAs: cas, Dialer: c.cfg.Dialer, Clock: c.cfg.Clock, Timeout: c.cfg.Timeout})
			if ctx.Err() != nil {
				// Closing: a check cut short says nothing of the node.
				return
			}
			c.record(n, err)
		}()
	}
}

// record stores a check's outcome and schedules the next one.
func (c *Checker) record(n services.Node, err error) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	defer func() {
		close(c.updated)
		c.updated = make(chan struct{})
	}()
	s := c.nodes[n.UUID]
	if s == nil {
		return
	}
	s.inFlight = false
	if s.addr != n.Addr {
		// The record moved while it was checked: this answer is about an
		// address nobody routes to any more.
		return
	}
	was := s.status.Online
	first := !s.checked
	s.checked = true
	s.status.Checked = now
	log := c.cfg.Logger.WithFields(logrus.Fields{"node": n.UUID, "hostname": n.Hostname, "addr": n.Addr})
	if err == nil {
		s.status.Online, s.status.Error, s.status.Failures = true, "", 0
		s.backoff.Reset()
		s.next = now.Add(c.cfg.Interval)
		if first || !was {
			log.Info("OpenSSH node is online.")
		}
		return
	}
	s.status.Online, s.status.Error = false, err.Error()
	s.status.Failures++
	s.next = now.Add(s.backoff.Next())
	if first || was {
		log.WithError(err).Warn("OpenSSH node is offline.")
	} else {
		log.WithError(err).Debug("OpenSSH node is still offline.")
	}
}

func (c *Checker) hostCAs(ctx context.Context) ([]ssh.PublicKey, error) {
	ca, err := c.cfg.CAs.GetCertAuthority(ctx, c.cfg.ClusterName, services.HostCA, false)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	keys := make([]ssh.PublicKey, 0, len(ca.SSHPublicKeys))
	for _, k := range ca.SSHPublicKeys {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return nil, trace.BadParameter("host CA of cluster %q: %v", c.cfg.ClusterName, err)
		}
		keys = append(keys, pub)
	}
	if len(keys) == 0 {
		return nil, trace.BadParameter("host CA of cluster %q has no keys", c.cfg.ClusterName)
	}
	return keys, nil
}
