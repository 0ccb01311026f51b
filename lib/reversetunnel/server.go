// Package reversetunnel lets nodes that cannot accept connections (behind
// NAT, in private subnets) be reached: the node's Agent dials the proxy's
// tunnel port (3024) with its host certificate and keeps the SSH
// connection open; the proxy's Server registers it under the UUID in that
// certificate, and the Router opens a ChannelTransport on it for every
// client connection to the node, which the node serves with its own SSH
// server in-process: on a data connection the node opens to the tunnel
// port for it (conn.go: the client's bytes are not encrypted a second
// time by the tunnel), or inside the channel when it cannot.
//
// Trust: the tunnel port admits only host certificates of this cluster's
// host CA whose role is node (and, given Leaves, leaf clusters' proxies
// checked against their own host CAs: leaves.go); the UUID is the certificate's KeyId and
// nothing the node sends later can change it. The agent admits only a
// proxy's host certificate of the same CA. Keep-alives run on both ends
// (keepalive@openssh.com every KeepAliveInterval, KeepAliveCountMax
// missed = dead) so that a half-open tunnel is dropped within ~15s.
//
// Goroutines: Server owns one handler per connection (tracked in a map and
// a WaitGroup) and each handler owns its keep-alive; Close closes the
// listeners and every tunnel and waits for all of them.
package reversetunnel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/promreg"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/sshalgo"
	"github.com/postern-dev/postern/lib/utils"
)

// Defaults (reverse tunnels). 5s x 3: a half-open tunnel is
// found within ~15s, where Teleport's defaults take 15 minutes.
const (
	DefaultKeepAliveInterval = 5 * time.Second
	DefaultKeepAliveCountMax = 3
	// DefaultHandshakeTimeout bounds a tunnel's SSH handshake: a
	// connection that does not finish it is not a node.
	DefaultHandshakeTimeout = 10 * time.Second
)

// RoleNode is the host role the tunnel port admits.
const RoleNode = "node"

// RoleProxy is the host role an agent accepts at the other end.
const RoleProxy = "proxy"

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("reversetunnel: server closed")

// ServerConfig configures a Server.
type ServerConfig struct {
	// HostSigner is the proxy's host certificate signer. Required.
	HostSigner ssh.Signer
	// Algorithms are the key exchanges, ciphers and MACs offered; an
	// empty list means sshalgo's default one.
	Algorithms sshalgo.Lists
	// HostCAs returns this cluster's host CA keys, read on every
	// handshake so a rotated CA applies at once. Required.
	HostCAs func() []ssh.PublicKey
	// KeepAliveInterval and KeepAliveCountMax: zero means the defaults.
	KeepAliveInterval time.Duration
	KeepAliveCountMax int
	// HandshakeTimeout: zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// DialAuth connects to the auth API for a node's ChannelAuth; nil
	// refuses such channels (the node must reach auth by itself).
	DialAuth func(ctx context.Context) (net.Conn, error)
	// KeepAlive, when set, is the cluster's tunnel keep-alive setting now
	// (cluster_networking_config): read before every probe on this end
	// and announced to the agents, so a change applies to live tunnels
	// on both ends. Zero values mean KeepAliveInterval/KeepAliveCountMax.
	KeepAlive func() (interval time.Duration, countMax int)
	// Proxies, when set, lists the cluster's live proxies; agents are
	// told (RequestAnnounce) so that each keeps a tunnel to every proxy.
	Proxies func(ctx context.Context) ([]AnnouncedProxy, error)
	// Self is this proxy as announced: always in the list this server
	// sends (a proxy that announces is live, whether or not its own
	// heartbeat has landed yet). Used only with Proxies.
	Self AnnouncedProxy
	// AnnounceInterval is how often KeepAlive and Proxies are re-read
	// and a changed announcement sent; zero means
	// DefaultAnnounceInterval.
	AnnounceInterval time.Duration
	// Leaves, when set, admits leaf clusters' proxies (host role leaf,
	// see leaves.go) on this port too; nil refuses them like any
	// certificate that is not a node's.
	Leaves *Leaves
	// Deps: Audit receives refusals (events.AccessDenied, kind
	// "tunnel", with the count they stand for: each kind of refusal from
	// one source at once, its repeats within limiter.RefusalReportInterval
	// in one summary); Clock checks certificates and times keep-alives;
	// Metrics holds postern_tunnels and postern_tunnel_transports_total.
	// Zero fields get observe's defaults.
	observe.Deps
}

// DefaultAnnounceInterval: a new proxy or a keep-alive change reaches
// every agent within 5s; reading the list costs one auth call per proxy
// per interval.
const DefaultAnnounceInterval = 5 * time.Second

// CheckAndSetDefaults validates the config and fills in defaults.
func (c *ServerConfig) CheckAndSetDefaults() error {
	if c.HostSigner == nil {
		return trace.BadParameter("reversetunnel: missing HostSigner")
	}
	if c.HostCAs == nil {
		return trace.BadParameter("reversetunnel: missing HostCAs")
	}
	if c.KeepAliveInterval == 0 {
		c.KeepAliveInterval = DefaultKeepAliveInterval
	}
	if c.KeepAliveCountMax == 0 {
		c.KeepAliveCountMax = DefaultKeepAliveCountMax
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	c.Deps.SetDefaults(observe.ComponentTunnelServer)
	if c.AnnounceInterval <= 0 {
		c.AnnounceInterval = DefaultAnnounceInterval
	}
	return nil
}

// tunnel is one registered agent connection.
type tunnel struct {
	uuid  string
	sconn *ssh.ServerConn
	ka    *utils.SSHKeepAlive
	// done is closed when the tunnel has ended: its data connections
	// end with it.
	done chan struct{}
}

// Server is the proxy's tunnel port.
type Server struct {
	cfg     ServerConfig
	sshCfg  *ssh.ServerConfig
	tunnels prometheus.Gauge
	// transports counts dials served, by path (data_connection, in_band):
	// a node that keeps going in-band is one whose tunnel address takes
	// no data connections (see conn.go), at a throughput cost.
	transports *prometheus.CounterVec

	// mu guards listeners, byUUID, waiters, dataWaiters and closing.
	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	// byUUID holds each node's tunnels, newest first.
	byUUID map[string][]*tunnel
	// waiters[uuid] is closed (and removed) when a tunnel for uuid
	// registers: a dial waiting for a node blocks on it.
	waiters map[string]chan struct{}
	// changed is closed (and reset) when any tunnel registers or goes;
	// see Changed in observe.go.
	changed chan struct{}
	// dataWaiters[token] receives the data connection (conn.go) a dial
	// offered under token; an entry lives while its dial waits and is
	// taken by the first connection presenting the token.
	dataWaiters map[string]dataWaiter
	closing     bool
	// announcement is the latest Announcement sent (JSON), nil before
	// the first.
	announcement []byte
	// drained, when set, is closed (and cleared) at the next unregister:
	// Shutdown waits on it.
	drained chan struct{}
	// asked is set once AskToMove ran through Shutdown's caller.
	asked bool
	wg    sync.WaitGroup
	// stop ends the announce loop.
	stop     chan struct{}
	stopOnce sync.Once
	// denials coalesces the audit events of refusals (deny).
	denials *limiter.Denials
	// ctx is the server's lifetime (cancel: Close): the root of every
	// tunnel's and handshake's context, which no caller's outlives.
	ctx    context.Context
	cancel context.CancelFunc
}

// NewServer returns a Server; call Serve.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "postern", Name: "tunnels",
		Help: "Reverse tunnels from nodes connected to this proxy.",
	})
	g, err := promreg.Register(cfg.Metrics, g)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	tr, err := promreg.Register(cfg.Metrics, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "postern", Name: "tunnel_transports_total",
		Help: "Connections to tunnel nodes served, by path: data_connection (a TCP connection of its own) or in_band (inside the tunnel).",
	}, []string{"path"}))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	s := &Server{
		cfg:        cfg,
		tunnels:    g,
		transports: tr,
		listeners:  map[net.Listener]struct{}{},
		byUUID:     map[string][]*tunnel{},
		waiters:    map[string]chan struct{}{},
		stop:       make(chan struct{}),

		dataWaiters: map[string]dataWaiter{},
	}
	// The server owns its tunnels' lifetime (Close ends it): no caller's context.
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.denials, err = limiter.NewDenials(limiter.DenialsConfig{Report: s.auditDenial, Deps: cfg.Deps})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	s.sshCfg = &ssh.ServerConfig{ServerVersion: "SSH-2.0-postern-tunnel"}
	if err := cfg.Algorithms.ServerConfig(s.sshCfg, cfg.HostSigner); err != nil {
		return nil, trace.Wrap(err)
	}
	if cfg.KeepAlive != nil || cfg.Proxies != nil {
		s.wg.Add(1)
		go s.announceLoop()
	}
	return s, nil
}

// keepAlive is the keep-alive setting in force now.
func (s *Server) keepAlive() (time.Duration, int) {
	interval, count := s.cfg.KeepAliveInterval, s.cfg.KeepAliveCountMax
	if s.cfg.KeepAlive != nil {
		if i, c := s.cfg.KeepAlive(); i > 0 || c > 0 {
			if i > 0 {
				interval = i
			}
			if c > 0 {
				count = c
			}
		}
	}
	return interval, count
}

// refreshAnnouncement recomputes the announcement and, when it changed,
// sends it on every tunnel. A failed proxy list keeps the last one: a
// blip of the auth API must not make agents drop their other tunnels.
func (s *Server) refreshAnnouncement() {
	interval, count := s.keepAlive()
	a := Announcement{KeepAliveInterval: interval, KeepAliveCountMax: count}
	s.mu.Lock()
	prev := s.announcement
	s.mu.Unlock()
	if s.cfg.Proxies != nil {
		// The announcement loop's own pass, no request's: bounded by its interval.
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.AnnounceInterval)
		list, err := s.cfg.Proxies(ctx)
		cancel()
		switch {
		case err != nil && prev != nil:
			var old Announcement
			_ = json.Unmarshal(prev, &old)
			a.Proxies = old.Proxies
		case err != nil:
			s.cfg.Logger.WithError(err).Warn("Could not list the cluster's proxies for the tunnel agents.")
		default:
			a.Proxies = append([]AnnouncedProxy{}, list...)
		}
		if s.cfg.Self.UUID != "" && !slices.ContainsFunc(a.Proxies, func(x AnnouncedProxy) bool { return x.UUID == s.cfg.Self.UUID }) {
			a.Proxies = append(a.Proxies, s.cfg.Self)
			slices.SortFunc(a.Proxies, func(x, y AnnouncedProxy) int { return strings.Compare(x.UUID, y.UUID) })
		}
	}
	b, err := json.Marshal(a)
	if err != nil {
		return
	}
	s.mu.Lock()
	if bytes.Equal(b, s.announcement) {
		s.mu.Unlock()
		return
	}
	s.announcement = b
	var all []*tunnel
	for _, ts := range s.byUUID {
		all = append(all, ts...)
	}
	s.mu.Unlock()
	for _, t := range all {
		_, _, _ = t.sconn.SendRequest(RequestAnnounce, false, b)
	}
	// Leaves keep a tunnel to every proxy of this cluster too.
	s.cfg.Leaves.announce(b)
}

func (s *Server) announceLoop() {
	defer s.wg.Done()
	s.refreshAnnouncement()
	ticker := s.cfg.Clock.NewTicker(s.cfg.AnnounceInterval)
	defer ticker.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-ticker.Chan():
			s.refreshAnnouncement()
		}
	}
}

// Serve accepts tunnels on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	return utils.AcceptLoop{
		Listener:  ln,
		What:      "tunnels",
		Begin:     s.beginConn,
		Handle:    s.handleConn,
		End:       s.wg.Done,
		Closing:   s.isClosing,
		ErrClosed: ErrServerClosed,
	}.Run()
}

// beginConn counts a new connection in Close's wait; false once closing.
func (s *Server) beginConn() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	return true
}

// isClosing: closing, or moving its agents away (AskToMove closed the
// listeners on purpose).
func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing || s.asked
}

// AskToMove is the first half of make before break: it stops taking new
// tunnels and asks every agent to move (RequestMove): the agent opens a
// tunnel to another proxy, then drops this one once the sessions on it
// have ended. It does not wait; Shutdown does.
func (s *Server) AskToMove() {
	s.mu.Lock()
	s.asked = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	var all []*tunnel
	for _, ts := range s.byUUID {
		all = append(all, ts...)
	}
	s.mu.Unlock()
	s.cfg.Logger.WithField("tunnels", len(all)).Info("Asking the tunnel agents to move to another proxy.")
	for _, t := range all {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_, _, _ = t.sconn.SendRequest(RequestMove, true, nil)
		}()
	}
}

// Shutdown asks the agents to move (AskToMove, if not done yet: a second
// ask is harmless), waits until their tunnels are gone or ctx ends, then
// closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	asked := s.asked
	s.mu.Unlock()
	if !asked {
		s.AskToMove()
	}
	for {
		s.mu.Lock()
		n := len(s.byUUID)
		gone := make(chan struct{})
		s.drained = gone
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-gone:
			continue
		case <-ctx.Done():
			s.cfg.Logger.WithField("tunnels", n).Warn("Tunnel agents did not move in time; closing their tunnels.")
		}
		break
	}
	return s.Close()
}

// Close closes the listeners and every tunnel and waits for them.
func (s *Server) Close() error {
	s.cancel()
	s.stopOnce.Do(func() { close(s.stop) })
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	var all []*tunnel
	for _, ts := range s.byUUID {
		all = append(all, ts...)
	}
	s.mu.Unlock()
	for _, t := range all {
		_ = t.sconn.Close()
	}
	s.cfg.Leaves.closeAll()
	s.wg.Wait()
	// After the last handler: no refusal is left to count.
	s.denials.Close()
	return nil
}

const (
	permUUID = "postern-tunnel-uuid"
	// permLeaf carries an admitted leaf's cluster name (Extensions) and
	// its certificate (ExtraData).
	permLeaf = "postern-tunnel-leaf"
)

// checkNodeCert is the tunnel port's admission rule: a host certificate
// of this cluster's host CA, valid now, with role node. The UUID is the
// KeyId, which auth sets to the host's UUID and is always a principal.
func (s *Server) checkNodeCert(key ssh.PublicKey) (string, error) {
	cert, ok := key.(*ssh.Certificate)
	if !ok {
		return "", trace.AccessDenied("a plain %s key, not a host certificate", key.Type())
	}
	if cert.CertType != ssh.HostCert {
		return "", trace.AccessDenied("a user certificate (key id %q), not a host certificate", cert.KeyId)
	}
	if err := authz.CheckHostCert(s.cfg.HostCAs(), cert.KeyId, cert, s.cfg.Clock); err != nil {
		return "", trace.Wrap(err)
	}
	if role := cert.Extensions[services.CertExtensionHostRole]; role != RoleNode {
		return "", trace.AccessDenied("host certificate %q has role %q, only %q may open a tunnel", cert.KeyId, role, RoleNode)
	}
	return cert.KeyId, nil
}

// deny logs and audits a refusal whose reason is the same each time the
// same peer does the same thing (a refused certificate): the reason is
// its kind for limiter.Denials.
func (s *Server) deny(remote net.Addr, reason string) {
	s.denyAs(remote, reason, reason)
}

// denyAs is deny for a reason that differs between connections of one
// attack (a handshake error names the connection's addresses): kind is
// what stays the same.
func (s *Server) denyAs(remote net.Addr, kind, reason string) {
	s.cfg.Logger.WithFields(logrus.Fields{"remote_addr": remote.String(), "reason": reason}).Debug("Tunnel refused.")
	s.denials.Deny(remote.String(), kind, reason)
}

// auditDenial writes what limiter.Denials reports, and logs it as a
// warning: a flood costs a bounded number of lines too (each refusal is
// logged at debug level).
func (s *Server) auditDenial(d limiter.Denial) {
	s.cfg.Logger.WithFields(logrus.Fields{"remote_addr": d.Addr, "reason": d.Text(), "count": d.Count}).Warn("Tunnel refused.")
	// limiter.Denials reports from its own timer, after the connection
	// that was refused is gone, and flushes at Close: the server's
	// context, without its cancel, is all there is.
	s.cfg.Audit.Emit(context.WithoutCancel(s.ctx), events.Event{
		Type: events.AccessDenied,
		Fields: events.Fields{
			events.FieldKind: "tunnel", events.FieldRemoteAddr: d.Addr, events.FieldReason: d.Text(), events.FieldCount: d.Count,
		},
	})
}

func (s *Server) handleConn(nc net.Conn) {
	// The accepted connection, for limiter.HandshakeDone once it has
	// authenticated (nc is wrapped below).
	accepted := nc
	_ = nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	// A node's data connection, or an SSH client (whose first bytes are
	// "SSH-2.0-"): the bytes read to tell are replayed to the handshake.
	var head [len(dataConnMagic)]byte
	n, _ := io.ReadFull(nc, head[:])
	if string(head[:n]) == dataConnMagic {
		s.handleDataConn(nc)
		return
	}
	nc = &prefixConn{Conn: nc, prefix: head[:n]}
	// The connection's context: the server's lifetime, ended when this
	// connection is done. The handshake's checks (a leaf's CA, maybe an
	// auth call) are bounded like the handshake itself.
	connCtx, endConn := context.WithCancel(s.ctx)
	defer endConn()
	hctx, endHandshake := context.WithTimeout(connCtx, s.cfg.HandshakeTimeout)
	defer endHandshake()
	// Per connection, so that exactly one refusal is audited whether the
	// peer failed at the key (the callback knows why) or before it.
	cfg := *s.sshCfg
	var refused bool
	cfg.PublicKeyCallback = func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
		if s.cfg.Leaves != nil && isLeafCert(key) {
			cluster, err := s.cfg.Leaves.checkLeafCert(hctx, key)
			if err != nil {
				refused = true
				s.deny(meta.RemoteAddr(), trace.UserMessage(err))
				return nil, err
			}
			return &ssh.Permissions{Extensions: map[string]string{permLeaf: cluster}, ExtraData: map[any]any{permLeaf: key}}, nil
		}
		uuid, err := s.checkNodeCert(key)
		if err != nil {
			refused = true
			s.deny(meta.RemoteAddr(), trace.UserMessage(err))
			return nil, err
		}
		return &ssh.Permissions{Extensions: map[string]string{permUUID: uuid}}, nil
	}
	// One try: a node offers exactly its host certificate.
	cfg.MaxAuthTries = 1
	sconn, chans, reqs, err := ssh.NewServerConn(nc, &cfg)
	if err != nil {
		if !refused {
			s.denyAs(nc.RemoteAddr(), "tunnel handshake failed", "tunnel handshake failed: "+err.Error())
		}
		_ = nc.Close()
		return
	}
	_ = nc.SetDeadline(time.Time{})
	endHandshake()
	limiter.HandshakeDone(accepted)
	if cluster := sconn.Permissions.Extensions[permLeaf]; cluster != "" {
		cert, _ := sconn.Permissions.ExtraData[permLeaf].(*ssh.Certificate)
		s.mu.Lock()
		ann := s.announcement
		s.mu.Unlock()
		s.cfg.Leaves.serveLeaf(sconn, chans, reqs, cluster, cert, ann)
		return
	}
	t := &tunnel{uuid: sconn.Permissions.Extensions[permUUID], sconn: sconn, done: make(chan struct{})}
	defer close(t.done)
	log := s.cfg.Logger.WithFields(logrus.Fields{"uuid": t.uuid, "remote_addr": nc.RemoteAddr().String()})
	// The only channel a node may open is one to the auth API.
	tunnelCtx, endTunnel := context.WithCancel(connCtx)
	var chWG sync.WaitGroup
	defer chWG.Wait()
	defer endTunnel()
	chWG.Add(1)
	go func() {
		defer chWG.Done()
		for nch := range chans {
			if nch.ChannelType() != ChannelAuth || s.cfg.DialAuth == nil || len(nch.ExtraData()) > 0 {
				s.deny(nc.RemoteAddr(), fmt.Sprintf("tunnel from node %q opened channel %q (%d bytes of extra data), refused", t.uuid, truncateText(nch.ChannelType()), len(nch.ExtraData())))
				_ = nch.Reject(ssh.Prohibited, "a tunnel carries only transport channels from the proxy and auth channels from the node")
				continue
			}
			chWG.Add(1)
			go func() {
				defer chWG.Done()
				s.spliceAuth(tunnelCtx, t.uuid, nch)
			}()
		}
	}()
	ka := utils.SSHKeepAliveConfig{Interval: s.cfg.KeepAliveInterval, CountMax: s.cfg.KeepAliveCountMax, Clock: s.cfg.Clock, FromLastAnswer: true}
	if s.cfg.KeepAlive != nil {
		ka.Params = s.keepAlive
	}
	t.ka = utils.StartSSHKeepAlive(sconn, "tunnel from "+t.uuid, ka)
	if !s.register(t) {
		t.ka.Close()
		_ = sconn.Close()
		return
	}
	log.Info("Tunnel connected.")
	s.mu.Lock()
	ann := s.announcement
	s.mu.Unlock()
	if ann != nil {
		_, _, _ = sconn.SendRequest(RequestAnnounce, false, ann)
	}
	// Global requests: keep-alives are answered (a refusal is an answer),
	// everything else is refused and audited: a node has nothing to ask
	// the proxy, and its name is its certificate's.
	for req := range reqs {
		if req.Type != "keepalive@openssh.com" {
			s.deny(nc.RemoteAddr(), fmt.Sprintf("tunnel from node %q sent global request %q, refused", t.uuid, truncateText(req.Type)))
		}
		if req.WantReply {
			_ = req.Reply(false, nil)
		}
	}
	s.unregister(t)
	t.ka.Close()
	_ = sconn.Close()
	log.WithError(t.ka.Err()).Info("Tunnel disconnected.")
}

func (s *Server) register(t *tunnel) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.byUUID[t.uuid] = append([]*tunnel{t}, s.byUUID[t.uuid]...)
	if w, ok := s.waiters[t.uuid]; ok {
		close(w)
		delete(s.waiters, t.uuid)
	}
	s.tunnels.Inc()
	s.changedLocked()
	return true
}

func (s *Server) unregister(t *tunnel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.byUUID[t.uuid]
	for i, x := range ts {
		if x == t {
			ts = append(ts[:i:i], ts[i+1:]...)
			s.tunnels.Dec()
			break
		}
	}
	if len(ts) == 0 {
		delete(s.byUUID, t.uuid)
	} else {
		s.byUUID[t.uuid] = ts
	}
	s.changedLocked()
	if s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
}

// HasTunnel reports whether a tunnel from uuid is connected here.
func (s *Server) HasTunnel(uuid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byUUID[uuid]) > 0
}

// TunnelRegistered returns a channel closed when a tunnel from uuid next
// registers. Callers check HasTunnel after taking it, so that a tunnel
// that registered in between is not missed.
func (s *Server) TunnelRegistered(uuid string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.waiters[uuid]
	if !ok {
		w = make(chan struct{})
		s.waiters[uuid] = w
	}
	return w
}

// spliceAuth connects a node's ChannelAuth to the auth API and copies
// bytes both ways until either side closes.
func (s *Server) spliceAuth(tunnelCtx context.Context, uuid string, nch ssh.NewChannel) {
	ctx, cancel := context.WithTimeout(tunnelCtx, DefaultHandshakeTimeout)
	ac, err := s.cfg.DialAuth(ctx)
	cancel()
	if err != nil {
		s.cfg.Logger.WithError(err).WithField("uuid", uuid).Warn("Could not reach the auth API for a tunnel node.")
		_ = nch.Reject(ssh.ConnectionFailed, "the proxy cannot reach the auth API")
		return
	}
	ch, reqs, err := nch.Accept()
	if err != nil {
		_ = ac.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	// tunnelCtx ends with the tunnel, so that a splice never outlives it.
	_, _, _ = utils.Splice(tunnelCtx, ch, ac)
}

// truncateText quotes-safe shortens a peer-supplied name for a log line
// and an audit reason: at most 64 bytes, control characters escaped.
func truncateText(v string) string {
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	q := strconv.Quote(v)
	return q[1 : len(q)-1]
}
