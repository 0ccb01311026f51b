package reversetunnel

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// Leaf clusters' tunnels (docs/leaf-clusters.md): a leaf's proxy dials a
// root proxy's tunnel port, the same port nodes use, with a host
// certificate of role leaf that the leaf's auth server signed with the
// leaf's host CA and whose cluster extension names the leaf. The root
// checks it against the host CA it stored for that leaf when trust was
// established; nothing else admits it: a leaf's node certificate (role
// node, leaf CA), a leaf certificate signed by any other CA (a leaf
// presenting a CA different from the one exchanged), and a leaf
// certificate naming a cluster that is not a leaf here are all refused
// and audited. While a tunnel is up the root proxy re-checks it every
// ReportInterval (so `pctl clusters rm` cuts it within that) and reports
// it to auth (the leaf's status and last_connected).

// RoleLeaf is the host role a leaf cluster's proxy presents.
const RoleLeaf = "leaf"

// LeafTrust is what the root's tunnel port asks about leaves.
type LeafTrust interface {
	// HostCAs returns the host CA keys stored for cluster name (NotFound
	// when none), from memory: it runs for every handshake that claims
	// to be a leaf, before anything proves the claim, so it must cost an
	// unauthenticated peer nothing but a map lookup.
	HostCAs(ctx context.Context, name string) ([]ssh.PublicKey, error)
	// IsLeaf confirms that name is a leaf of this cluster (a CA alone is
	// not enough: this cluster also holds the CAs of the roots it
	// trusts); NotFound when it is not. It may ask auth: it runs only
	// for a certificate its stored CA signed.
	IsLeaf(ctx context.Context, name string) error
	// Touch reports a live tunnel from leaf cluster name.
	Touch(ctx context.Context, name string) error
}

// LeavesConfig configures Leaves.
type LeavesConfig struct {
	// Trust answers which leaves exist and their CAs. Required.
	Trust LeafTrust
	// ClusterName is this (root) cluster's name, never a leaf's.
	// Required.
	ClusterName string
	// ReportInterval is how often a live leaf tunnel is re-checked and
	// reported; zero means DefaultLeafReportInterval.
	ReportInterval time.Duration
	// KeepAliveInterval and KeepAliveCountMax time the tunnels'
	// keep-alives; zero means the defaults.
	KeepAliveInterval time.Duration
	KeepAliveCountMax int
	// Deps: Clock checks certificates and times reports; Logger. Zero
	// fields get observe's defaults.
	observe.Deps
}

// DefaultLeafReportInterval: a removed leaf's tunnel is cut, and a live
// one reported, within 5s (removing trust must cut access within 5s).
const DefaultLeafReportInterval = 5 * time.Second

// leafCheckTimeout bounds one trust lookup (an auth API call).
const leafCheckTimeout = 10 * time.Second

// CheckAndSetDefaults validates the config.
func (c *LeavesConfig) CheckAndSetDefaults() error {
	if c.Trust == nil {
		return trace.BadParameter("leaves: missing Trust")
	}
	if c.ClusterName == "" {
		return trace.BadParameter("leaves: missing ClusterName")
	}
	if c.ReportInterval <= 0 {
		c.ReportInterval = DefaultLeafReportInterval
	}
	if c.KeepAliveInterval == 0 {
		c.KeepAliveInterval = DefaultKeepAliveInterval
	}
	if c.KeepAliveCountMax == 0 {
		c.KeepAliveCountMax = DefaultKeepAliveCountMax
	}
	c.Deps.SetDefaults(observe.ComponentTunnelLeaves)
	return nil
}

// leafTunnel is one leaf proxy's live tunnel.
type leafTunnel struct {
	cluster string
	proxy   string // the leaf proxy's UUID (certificate KeyId)
	cert    *ssh.Certificate
	sconn   *ssh.ServerConn
}

// Leaves holds the leaf tunnels of one root proxy. The tunnel Server
// hands it the connections whose certificate has role leaf; each is
// served by serveLeaf on the Server's connection goroutine.
type Leaves struct {
	cfg LeavesConfig
	// mu guards byCluster, changed and closed.
	mu sync.Mutex
	// byCluster is keyed by the lower-cased cluster name (OpenSSH
	// lower-cases HOST.LEAF); newest tunnel first.
	byCluster map[string][]*leafTunnel
	// changed is closed (and replaced) whenever the set of leaves with a
	// tunnel here changes: the lease keeper waits on it.
	changed chan struct{}
	closed  bool
}

// NewLeaves returns an empty registry.
func NewLeaves(cfg LeavesConfig) (*Leaves, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	return &Leaves{cfg: cfg, byCluster: map[string][]*leafTunnel{}, changed: make(chan struct{})}, nil
}

// isLeafCert reports whether key claims to be a leaf proxy's certificate
// (before any check: it only routes the key to checkLeafCert).
func isLeafCert(key ssh.PublicKey) bool {
	cert, ok := key.(*ssh.Certificate)
	return ok && cert.Extensions[services.CertExtensionHostRole] == RoleLeaf
}

// checkLeafCert is the admission rule for leaves. It returns the leaf's
// cluster name.
func (l *Leaves) checkLeafCert(ctx context.Context, key ssh.PublicKey) (string, error) {
	cert, ok := key.(*ssh.Certificate)
	if !ok || cert.CertType != ssh.HostCert {
		return "", trace.AccessDenied("not a host certificate")
	}
	cluster := cert.Extensions[services.CertExtensionCluster]
	if cluster == "" || services.CheckClusterName(cluster) != nil {
		return "", trace.AccessDenied("leaf certificate %q names no valid cluster", cert.KeyId)
	}
	if cluster == l.cfg.ClusterName {
		return "", trace.AccessDenied("leaf certificate %q names this cluster %q", cert.KeyId, cluster)
	}
	ctx, cancel := context.WithTimeout(ctx, leafCheckTimeout)
	defer cancel()
	cas, err := l.cfg.Trust.HostCAs(ctx, cluster)
	if trace.IsNotFound(err) {
		return "", trace.AccessDenied("cluster %q is not a leaf of this cluster", cluster)
	}
	if err != nil {
		return "", trace.Wrap(err)
	}
	if err := authz.CheckHostCert(cas, cert.KeyId, cert, l.cfg.Clock); err != nil {
		return "", trace.AccessDenied("leaf %q: %v", cluster, trace.UserMessage(err))
	}
	// Signed by the CA stored for cluster: now it is worth asking.
	if err := l.cfg.Trust.IsLeaf(ctx, cluster); trace.IsNotFound(err) {
		return "", trace.AccessDenied("cluster %q is not a leaf of this cluster", cluster)
	} else if err != nil {
		return "", trace.Wrap(err)
	}
	return cluster, nil
}

// serveLeaf runs one admitted leaf tunnel until it ends: it refuses every
// channel and request from the leaf (a leaf asks nothing of its root),
// answers keep-alives, and every ReportInterval re-checks the leaf's
// trust (closing the tunnel when it is gone) and reports it live.
//
// ann is the tunnel server's current announcement (nil: none yet): sent
// at once, like to a node, so that the leaf's agent pool keeps a tunnel
// to every proxy of this cluster; later ones come through announce.
func (l *Leaves) serveLeaf(sconn *ssh.ServerConn, chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request, cluster string, cert *ssh.Certificate, ann []byte) {
	t := &leafTunnel{cluster: cluster, proxy: cert.KeyId, cert: cert, sconn: sconn}
	log := l.cfg.Logger.WithFields(logrus.Fields{"leaf": cluster, "leaf_proxy": t.proxy, "remote_addr": sconn.RemoteAddr().String()})
	ka := utils.StartSSHKeepAlive(sconn, "tunnel from leaf "+cluster, utils.SSHKeepAliveConfig{
		Interval: l.cfg.KeepAliveInterval, CountMax: l.cfg.KeepAliveCountMax, Clock: l.cfg.Clock,
	})
	defer func() {
		if ka != nil {
			ka.Close()
		}
	}()
	if !l.register(t) {
		_ = sconn.Close()
		return
	}
	defer l.unregister(t)
	log.Info("Leaf cluster tunnel connected.")
	if ann != nil {
		_, _, _ = sconn.SendRequest(RequestAnnounce, false, ann)
	}
	l.report(t, log)

	var wg sync.WaitGroup
	defer wg.Wait()
	stop := make(chan struct{})
	defer close(stop)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for nch := range chans {
			_ = nch.Reject(ssh.Prohibited, "a leaf's tunnel carries only transport channels from the root")
		}
	}()
	go func() {
		defer wg.Done()
		// The full re-check (auth is asked) and report run every
		// ReportInterval; in between, every leafCACheckInterval, the
		// certificate is checked against the leaf's CA as the access
		// cache holds it now, so `pctl clusters rm` (which deletes the
		// leaf's CAs) cuts the tunnel, and routing to the leaf, within
		// about a second.
		next := l.cfg.Clock.Now().Add(l.cfg.ReportInterval)
		for {
			wait := min(leafCACheckInterval, next.Sub(l.cfg.Clock.Now()))
			select {
			case <-stop:
				return
			case <-l.cfg.Clock.After(wait):
			}
			var ok bool
			if now := l.cfg.Clock.Now(); !now.Before(next) {
				ok = l.report(t, log)
				next = now.Add(l.cfg.ReportInterval)
			} else {
				ok = l.stillSigned(t, log)
			}
			if !ok {
				_ = sconn.Close()
				return
			}
		}
	}()
	ssh.DiscardRequests(reqs)
	_ = sconn.Close()
	log.Info("Leaf cluster tunnel disconnected.")
}

// leafCACheckInterval is how often a live leaf tunnel's certificate is
// checked against the leaf's stored host CA between full re-checks.
const leafCACheckInterval = time.Second

// stillSigned checks t's certificate against the leaf's host CA as the
// proxy's access cache holds it (no auth call where the cache is
// in-memory): false once the CA is gone or no longer signs it.
func (l *Leaves) stillSigned(t *leafTunnel, log logrus.FieldLogger) bool {
	// A periodic re-check owned by the tunnel's watch loop, not by any
	// request: bounded by its own timeout.
	ctx, cancel := context.WithTimeout(context.Background(), leafCheckTimeout)
	defer cancel()
	cas, err := l.cfg.Trust.HostCAs(ctx, t.cluster)
	switch {
	case trace.IsNotFound(err):
		log.Warn("Leaf cluster's CA removed: closing its tunnel.")
		return false
	case err != nil:
		return true
	}
	if err := authz.CheckHostCert(cas, t.cert.KeyId, t.cert, l.cfg.Clock); err != nil {
		log.WithError(err).Warn("Leaf cluster's CA no longer signs its tunnel certificate: closing it.")
		return false
	}
	return true
}

// report re-checks t's certificate against the leaf's CA as it is now
// and, if it still passes, reports the tunnel live. It returns false
// when the leaf is no longer trusted (removed, or its CA changed).
func (l *Leaves) report(t *leafTunnel, log logrus.FieldLogger) bool {
	// Like stillSigned: the watch loop's own check, no request's.
	ctx, cancel := context.WithTimeout(context.Background(), leafCheckTimeout)
	defer cancel()
	if _, err := l.checkLeafCert(ctx, t.cert); err != nil {
		if trace.IsAccessDenied(err) {
			log.WithError(err).Warn("Leaf cluster no longer trusted: closing its tunnel.")
			return false
		}
		// Auth unreachable: keep the tunnel (it was admitted) and try
		// again next time.
		log.WithError(err).Warn("Cannot re-check a leaf cluster's tunnel.")
		return true
	}
	if err := l.cfg.Trust.Touch(ctx, t.cluster); err != nil {
		log.WithError(err).Warn("Cannot report a leaf cluster's tunnel.")
	}
	return true
}

func (l *Leaves) register(t *leafTunnel) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	k := strings.ToLower(t.cluster)
	l.byCluster[k] = append([]*leafTunnel{t}, l.byCluster[k]...)
	l.changedLocked()
	return true
}

func (l *Leaves) changedLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *Leaves) unregister(t *leafTunnel) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := strings.ToLower(t.cluster)
	ts := l.byCluster[k]
	for i, x := range ts {
		if x == t {
			ts = append(ts[:i:i], ts[i+1:]...)
			break
		}
	}
	if len(ts) == 0 {
		delete(l.byCluster, k)
		l.changedLocked()
	} else {
		l.byCluster[k] = ts
	}
}

// announce sends a changed announcement on every leaf tunnel (the tunnel
// server's refreshAnnouncement). Safe on a nil *Leaves.
func (l *Leaves) announce(b []byte) {
	if l == nil {
		return
	}
	l.mu.Lock()
	var all []*leafTunnel
	for _, ts := range l.byCluster {
		all = append(all, ts...)
	}
	l.mu.Unlock()
	for _, t := range all {
		_, _, _ = t.sconn.SendRequest(RequestAnnounce, false, b)
	}
}

// Count is the number of leaf tunnels here (postern_leaf_tunnels).
func (l *Leaves) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ts := range l.byCluster {
		n += len(ts)
	}
	return n
}

// HasLeaf reports whether a tunnel from leaf cluster name (any case) is
// here. Safe on a nil *Leaves.
func (l *Leaves) HasLeaf(name string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byCluster[strings.ToLower(name)]) > 0
}

// LeafName is the cluster name, as its certificate spells it, of the leaf
// whose tunnel here name (any case) means; false when there is none.
func (l *Leaves) LeafName(name string) (string, bool) {
	if l == nil {
		return "", false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := l.byCluster[strings.ToLower(name)]
	if len(ts) == 0 {
		return "", false
	}
	return ts[0].cluster, true
}

// TunnelUUIDs are the tunnel IDs (services.LeafTunnelID) of the leaves
// with a tunnel here: what this proxy leases so that its peers reach the
// leaves through it. They come from this registry only, so a proxy never
// leases a leaf tunnel it does not hold.
func (l *Leaves) TunnelUUIDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.byCluster))
	for _, ts := range l.byCluster {
		out = append(out, services.LeafTunnelID(ts[0].cluster))
	}
	return out
}

// Changed is closed when the set of leaves with a tunnel here next
// changes.
func (l *Leaves) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// DialLeaf opens a transport channel to leaf cluster name's proxy over
// its newest tunnel here (the next one if that fails); NotFound when there
// is none. The leaf's proxy reads a proxyapi.LeafRequest first
// (proxy.LeafTransport); source and destination are for its logs.
func (l *Leaves) DialLeaf(ctx context.Context, name, source, destination string) (net.Conn, error) {
	if l == nil {
		return nil, trace.NotFound("no tunnel from leaf cluster %q on this proxy", name)
	}
	l.mu.Lock()
	ts := append([]*leafTunnel(nil), l.byCluster[strings.ToLower(name)]...)
	l.mu.Unlock()
	if len(ts) == 0 {
		return nil, trace.NotFound("no tunnel from leaf cluster %q on this proxy", name)
	}
	extra, err := json.Marshal(TransportRequest{Source: source, Destination: destination, Meta: metaOf(ctx)})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var last error
	for _, t := range ts {
		if err := ctx.Err(); err != nil {
			return nil, trace.Wrap(err)
		}
		ch, reqs, err := t.sconn.OpenChannel(ChannelTransport, extra)
		if err != nil {
			last = err
			continue
		}
		go ssh.DiscardRequests(reqs)
		return newChannelConn(ch, "proxy", "leaf:"+t.cluster), nil
	}
	return nil, trace.ConnectionProblem(last, "opening a channel on the tunnel from leaf cluster %q: %v", name, last)
}

// closeAll closes every leaf tunnel and refuses new ones (Server.Close;
// each serveLeaf then returns on its connection goroutine, which the
// Server waits for). Safe on a nil *Leaves.
func (l *Leaves) closeAll() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	var all []*leafTunnel
	for _, ts := range l.byCluster {
		all = append(all, ts...)
	}
	l.mu.Unlock()
	for _, t := range all {
		_ = t.sconn.Close()
	}
}
