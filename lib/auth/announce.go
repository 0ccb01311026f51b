package auth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/sshalgo"
)

// MaxHeartbeatTTL is the longest a remote host's inventory record lives
// without a fresh heartbeat: three default intervals, the TTL a Heartbeat
// uses by default. A node may ask for less (Expires - LastHeartbeat in its
// heartbeat), never more, so a node that is killed, or that wants to
// outlive its own death, leaves routing within this bound.
const MaxHeartbeatTTL = heartbeatTTLFactor * DefaultHeartbeatInterval

const (
	// addrCheckTimeout bounds one address check (dial and SSH handshake up
	// to the host key): a node's SSH server answers in milliseconds, and
	// the check must fit well inside the heartbeat's own deadline (one
	// interval) and the API's request timeout.
	addrCheckTimeout = 5 * time.Second
	// maxConcurrentAddrChecks bounds the dials auth makes on nodes' behalf.
	// Steady-state heartbeats never dial (the cache answers); this only
	// matters when many nodes start or move at once, or after an auth
	// restart, and keeps a node that announces a black-holed address from
	// tying up more than its share.
	maxConcurrentAddrChecks = 16
	// verifiedAddrTTL: a verified (uuid, addr) pair is trusted this long,
	// then re-checked on the next heartbeat. It bounds how long a node
	// that stopped listening at a verified address (and something else
	// started to) keeps sending users there.
	verifiedAddrTTL = 10 * time.Minute
	// maxVerifiedAddrs bounds the cache: one entry per node.
	maxVerifiedAddrs = 100_000
)

// AnnounceNode stores a heartbeat sent over the API by a remote host whose
// certificate says it is callerID with role callerRole (RoleNode or
// RoleProxy). What the host says is checked, not believed:
//   - it may announce only itself (UUID = certificate CN) in this cluster;
//   - its hostname and labels must pass the same rules as at join
//     (checkHostHostname, services.CheckNodeLabels);
//   - LastHeartbeat is the auth server's time, and Expires is that plus
//     the TTL the host asked for, at most MaxHeartbeatTTL: a record dated
//     2099 would win `most_recent` routing forever and never expire;
//   - its address enters the inventory only once auth has seen the host's
//     own host certificate answer there (verifyAddr); a refused address
//     leaves the previous record as it was;
//   - auth dials that address only when its host is the address the
//     heartbeat came from (sourceAddr, host:port as the API saw it) or
//     lies in cluster_networking_config spec.node_address_networks:
//     otherwise a node could make auth connect anywhere auth can reach.
//
// The auth server's own host (ServerConfig.HostUUID: an all-in-one's node,
// which announces through the in-process client like any other) is held
// to all of this except the naming rules.
func (s *Server) AnnounceNode(ctx context.Context, callerID, callerRole, sourceAddr string, node services.Node) error {
	if node.Cluster == "" {
		node.Cluster = s.cfg.ClusterName
	}
	if node.UUID != callerID {
		return trace.AccessDenied("%s %q may not announce node %q", callerRole, callerID, node.UUID)
	}
	if node.Cluster != s.cfg.ClusterName {
		return trace.AccessDenied("%s %q may not announce a node in cluster %q", callerRole, callerID, node.Cluster)
	}
	if node.Kind != "" && node.Kind != services.NodeKindPostern {
		// An OpenSSH record is the admin's word that a stock sshd is
		// there: it never expires and the proxies treat it as a server
		// they reach with their own SSH client. A host that heartbeats
		// is a Postern node by definition and may not claim otherwise.
		return trace.AccessDenied("%s %q may not announce a node of kind %q: only an admin registers one", callerRole, callerID, node.Kind)
	}
	if node.Hostname != "" && !s.isOwnHost(callerID) {
		clusters, err := s.knownClusters(ctx)
		if err != nil {
			return trace.Wrap(err)
		}
		if err := s.checkHostHostname(callerRole, node.Hostname, node.UUID, node.Addr, clusters); err != nil {
			return trace.BadParameter("node %q: %v", node.UUID, trace.UserMessage(err))
		}
	}
	now := s.clock.Now().UTC()
	ttl := node.Expires.Sub(node.LastHeartbeat)
	if node.Expires.IsZero() || node.LastHeartbeat.IsZero() || ttl <= 0 || ttl > MaxHeartbeatTTL {
		ttl = MaxHeartbeatTTL
	}
	node.LastHeartbeat = now
	node.Expires = now.Add(ttl)
	// Everything else about the record, before anything is dialed.
	if err := node.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	// A tunnel node announces no address (CheckAndSetDefaults refused
	// one): there is nothing to dial and nothing to prove. It may only be
	// reached over a tunnel, and the tunnel port names the node by its
	// certificate, so claiming tunnel: true captures nobody's traffic.
	if !node.Tunnel {
		if err := s.addrs.verify(ctx, node.UUID, node.Addr, s.addrPolicy(sourceAddr)); err != nil {
			return trace.Wrap(err)
		}
	}
	return trace.Wrap(s.store.UpsertNode(ctx, node))
}

// isOwnHost reports whether id is the host this auth server runs on.
func (s *Server) isOwnHost(id string) bool {
	return s.cfg.HostUUID != "" && id == s.cfg.HostUUID
}

// addrVerifier proves that an announced address answers with the
// announcing host's own host certificate, and remembers the pairs it has
// proven.
//
// Why: the proxy dials whatever address the inventory holds and relays the
// bytes, so without this a node could point users (and their forwarded
// agents) at the auth API, the web port, another node or any internal
// service. The check is an SSH handshake up to the host key: the server
// has to sign the exchange hash with the key the certificate is for
// (x/crypto checks that before the callback), the certificate must be a
// host certificate of this cluster's host CA for exactly the caller's UUID,
// and the handshake is abandoned right after, so no user authentication is
// ever attempted.
type addrVerifier struct {
	clock clockwork.Clock
	log   logrus.FieldLogger
	// hostCAKeys returns the host CA's public keys (a func so that a
	// future CA rotation is seen here).
	hostCAKeys func() []ssh.PublicKey
	// dial connects to an address; net.Dialer's by default.
	dial func(ctx context.Context, addr string) (net.Conn, error)
	// lookup resolves an announced DNS name; net.DefaultResolver's by
	// default.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// localAddrs lists this machine's interface addresses;
	// interfaceAddrs by default.
	localAddrs func() []netip.Addr
	// sem bounds concurrent checks.
	sem chan struct{}
	// timeout bounds one check; addrCheckTimeout.
	timeout time.Duration

	// mu guards verified (uuid -> last address proven for it) and
	// inflight (uuids with a check running: one each, so a node announcing
	// black holes holds at most one of the sem slots).
	mu       sync.Mutex
	verified map[string]verifiedAddr
	inflight map[string]bool
}

type verifiedAddr struct {
	addr string
	at   time.Time
}

func newAddrVerifier(clock clockwork.Clock, log logrus.FieldLogger, hostCAKeys func() []ssh.PublicKey) *addrVerifier {
	d := &net.Dialer{}
	return &addrVerifier{
		clock:      clock,
		log:        log,
		hostCAKeys: hostCAKeys,
		dial: func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		},
		lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		},
		localAddrs: interfaceAddrs,
		sem:        make(chan struct{}, maxConcurrentAddrChecks),
		timeout:    addrCheckTimeout,
		verified:   make(map[string]verifiedAddr),
		inflight:   make(map[string]bool),
	}
}

// addrPolicy decides where auth may dial on a node's word: the node's
// source address, and the configured networks. It reads the networking
// config only when a dial is due (a cached address costs nothing).
func (s *Server) addrPolicy(sourceAddr string) dialPolicy {
	return func(ctx context.Context) (netip.Addr, []netip.Prefix, error) {
		var src netip.Addr
		if host, _, err := net.SplitHostPort(sourceAddr); err == nil {
			if a, err := netip.ParseAddr(host); err == nil {
				src = a.Unmap()
			}
		}
		nc, err := s.store.GetClusterNetworkingConfig(ctx)
		if err != nil {
			return netip.Addr{}, nil, trace.Wrap(err)
		}
		nets, err := services.ParseNetworks(nc.Spec.NodeAddressNetworks)
		if err != nil {
			return netip.Addr{}, nil, trace.Wrap(err)
		}
		return src, nets, nil
	}
}

// dialPolicy returns the address a heartbeat came from (invalid when it
// is not known) and the networks auth may dial besides it.
type dialPolicy func(ctx context.Context) (source netip.Addr, networks []netip.Prefix, err error)

// maxResolvedAddrs bounds what a node's DNS name may resolve to: a name
// with hundreds of addresses is not a node's.
const maxResolvedAddrs = 16

// dialTarget is the IP:port auth dials to check addr, or AccessDenied
// when addr is outside the policy. A DNS name must resolve only to allowed
// addresses (the proxy later resolves it again and may take any of
// them), and the check dials the resolved IP, not the name, so a second
// answer of the resolver cannot move the dial elsewhere.
func (v *addrVerifier) dialTarget(ctx context.Context, uuid, addr string, policy dialPolicy) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", trace.BadParameter("node %q: address %q: %v", uuid, addr, err)
	}
	src, nets, err := policy(ctx)
	if err != nil {
		return "", trace.Wrap(err)
	}
	// A heartbeat from loopback comes from this machine: the node's own
	// addresses are then this machine's, reachable anyway through the
	// loopback address it came from (a node listening on 0.0.0.0
	// announces its first non-loopback IP).
	var local []netip.Addr
	if src.IsValid() && src.IsLoopback() {
		local = v.localAddrs()
	}
	allowed := func(a netip.Addr) bool {
		a = a.Unmap()
		if src.IsValid() && a == src {
			return true
		}
		if slices.Contains(local, a) {
			return true
		}
		for _, n := range nets {
			if n.Contains(a) {
				return true
			}
		}
		return false
	}
	refuse := func(what string) error {
		from, networks := "an unknown address", "empty"
		if src.IsValid() {
			from = src.String()
		}
		if len(nets) > 0 {
			networks = joinPrefixes(nets)
		}
		return trace.AccessDenied("node %q may not announce address %s: %s; the auth server checks only addresses at the one the node connects from (%s) or in cluster_networking_config spec.node_address_networks (%s)",
			uuid, addr, what, from, networks)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" || !allowed(a) {
			return "", refuse("that IP is not where it connects from")
		}
		return net.JoinHostPort(a.Unmap().String(), port), nil
	}
	resolved, err := v.lookup(ctx, host)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		// A name that does not exist is the node's to fix, not an
		// outage of ours: refused like any other address.
		return "", refuse(host + " does not resolve")
	}
	if err != nil {
		return "", trace.ConnectionProblem(err, "node %q: resolving %s: %v", uuid, host, err)
	}
	if len(resolved) == 0 || len(resolved) > maxResolvedAddrs {
		return "", refuse(fmt.Sprintf("%s resolves to %d addresses", host, len(resolved)))
	}
	for _, a := range resolved {
		if !allowed(a) {
			return "", refuse(fmt.Sprintf("%s resolves to %s", host, a.Unmap()))
		}
	}
	return net.JoinHostPort(resolved[0].Unmap().String(), port), nil
}

// interfaceAddrs is this machine's interface addresses (none when they
// cannot be read: then only the loopback source itself is allowed).
func interfaceAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

func joinPrefixes(nets []netip.Prefix) string {
	s := make([]string, len(nets))
	for i, n := range nets {
		s[i] = n.String()
	}
	return strings.Join(s, ", ")
}

// verify returns nil when addr is proven to answer with uuid's host
// certificate (from the cache, or by a fresh check), AccessDenied naming
// the address otherwise. Nothing is dialed outside policy (dialTarget).
func (v *addrVerifier) verify(ctx context.Context, uuid, addr string, policy dialPolicy) error {
	now := v.clock.Now()
	v.mu.Lock()
	e, ok := v.verified[uuid]
	if ok && e.addr == addr && now.Sub(e.at) < verifiedAddrTTL {
		v.mu.Unlock()
		return nil
	}
	if v.inflight[uuid] {
		v.mu.Unlock()
		return trace.LimitExceeded("an address check for node %q is already running; the heartbeat will be retried", uuid)
	}
	v.inflight[uuid] = true
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		delete(v.inflight, uuid)
		v.mu.Unlock()
	}()
	select {
	case v.sem <- struct{}{}:
		defer func() { <-v.sem }()
	case <-ctx.Done():
		return trace.ConnectionProblem(ctx.Err(), "too many node address checks in progress; the heartbeat will be retried")
	}
	target, err := v.dialTarget(ctx, uuid, addr, policy)
	if err != nil {
		v.log.WithFields(logrus.Fields{"uuid": uuid, "addr": addr}).WithError(err).Warn("Refused a node address outside the networks auth checks.")
		return trace.Wrap(err)
	}
	if err := v.check(ctx, uuid, target); err != nil {
		v.log.WithFields(logrus.Fields{"uuid": uuid, "addr": addr}).WithError(err).Warn("Refused a node address: it does not answer with the node's host certificate.")
		return trace.AccessDenied("node %q may not announce address %s: it does not answer with this node's host certificate (see the auth server's log)", uuid, addr)
	}
	v.remember(uuid, addr, now)
	v.log.WithFields(logrus.Fields{"uuid": uuid, "addr": addr}).Info("Verified a node address.")
	return nil
}

func (v *addrVerifier) remember(uuid, addr string, at time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.verified[uuid]; !ok && len(v.verified) >= maxVerifiedAddrs {
		for k, e := range v.verified {
			if at.Sub(e.at) >= verifiedAddrTTL {
				delete(v.verified, k)
			}
		}
		// Still full: forget an arbitrary entry; it is re-checked on its
		// node's next heartbeat, which costs a dial, not correctness.
		for k := range v.verified {
			if len(v.verified) < maxVerifiedAddrs {
				break
			}
			delete(v.verified, k)
		}
	}
	v.verified[uuid] = verifiedAddr{addr: addr, at: at}
}

// errAddrProven ends the handshake once the host key has been checked.
var errAddrProven = errors.New("host key verified")

// check dials addr and runs an SSH handshake up to the host key.
func (v *addrVerifier) check(ctx context.Context, uuid, addr string) error {
	// A real-time bound on network I/O, like every dial in this package
	// (a fake clock would never fire it).
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	conn, err := v.dial(ctx, addr)
	if err != nil {
		return trace.ConnectionProblem(err, "dialing %s: %v", addr, err)
	}
	// Closing the connection is what unblocks a handshake stuck on a peer
	// that never answers.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	defer conn.Close()

	// The callback runs on the handshake's goroutine: it reports through
	// a channel. A nil verdict means the host key was proven.
	verdicts := make(chan error, 1)
	// Every algorithm a node may be configured with (the probe must agree
	// with any node's ssh_* lists, and sends nothing but the handshake),
	// and host certificates only: a server that can only show a plain
	// key fails the negotiation, which is the right answer.
	cfg := sshalgo.AllSupported().ClientConfig(&ssh.ClientConfig{
		User: "postern-address-check",
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			verdict := v.checkHostKey(uuid, key)
			select {
			case verdicts <- verdict:
			default:
			}
			if verdict != nil {
				return verdict
			}
			return errAddrProven
		},
	})
	_, _, _, err = ssh.NewClientConn(conn, addr, cfg)
	select {
	case verdict := <-verdicts:
		return verdict
	default:
	}
	if ctx.Err() != nil {
		return trace.ConnectionProblem(ctx.Err(), "no SSH host key from %s within %v", addr, v.timeout)
	}
	return trace.BadParameter("no SSH host certificate from %s: %v", addr, err)
}

// checkHostKey accepts only a host certificate of this cluster's host CA,
// valid now, with a good signature, naming uuid: the host-CA check of
// every other dialer (authz.CheckHostCert). It must also be the node's own
// certificate (key id), which is said first: another node's certificate
// behind the announced address is the likely mistake.
func (v *addrVerifier) checkHostKey(uuid string, key ssh.PublicKey) error {
	cas := v.hostCAKeys()
	if cert, ok := key.(*ssh.Certificate); ok && cert.CertType == ssh.HostCert && authz.IsAuthority(cas, cert.SignatureKey) && cert.KeyId != uuid {
		return trace.AccessDenied("the server presented the host certificate of %q, not of %q", cert.KeyId, uuid)
	}
	return trace.Wrap(authz.CheckHostCert(cas, uuid, key, v.clock))
}

// AnnounceProxy stores a heartbeat sent over the API by a proxy whose
// certificate says it is callerID. As for nodes, what the proxy says is
// checked, not believed: it announces only itself in this cluster, and
// the dates are the auth server's (Expires at most MaxHeartbeatTTL
// ahead). Its addresses are not dialed: everything that dials them (a
// tunnel agent, a peer proxy) authenticates the proxy's host certificate
// at the other end, so a false address buys a refused handshake, not a
// captured connection.
func (s *Server) AnnounceProxy(ctx context.Context, callerID string, p services.Proxy) error {
	if p.Cluster == "" {
		p.Cluster = s.cfg.ClusterName
	}
	if p.UUID != callerID {
		return trace.AccessDenied("proxy %q may not announce proxy %q", callerID, p.UUID)
	}
	if p.Cluster != s.cfg.ClusterName {
		return trace.AccessDenied("proxy %q may not announce a proxy in cluster %q", callerID, p.Cluster)
	}
	now := s.clock.Now().UTC()
	ttl := p.Expires.Sub(p.LastHeartbeat)
	if p.Expires.IsZero() || p.LastHeartbeat.IsZero() || ttl <= 0 || ttl > MaxHeartbeatTTL {
		ttl = MaxHeartbeatTTL
	}
	p.LastHeartbeat = now
	p.Expires = now.Add(ttl)
	return trace.Wrap(s.store.UpsertProxy(ctx, p))
}

// RemoveProxy deletes the caller's own proxy record (a clean shutdown).
func (s *Server) RemoveProxy(ctx context.Context, callerID string) error {
	err := s.store.DeleteProxy(ctx, s.cfg.ClusterName, callerID)
	if trace.IsNotFound(err) {
		return nil
	}
	return trace.Wrap(err)
}
