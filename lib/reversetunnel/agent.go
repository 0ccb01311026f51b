package reversetunnel

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/backoff"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/promreg"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/sshalgo"
	"github.com/postern-dev/postern/lib/utils"
)

// Reconnect backoff: the first retry after ~250ms (a proxy restart is
// usually that quick), doubling to a 10s cap so that a fleet of agents
// does not hammer a proxy that is down; full jitter over [d/2, d] so that
// the fleet does not come back in lock step.
const (
	initialBackoff = 250 * time.Millisecond
	maxBackoff     = 10 * time.Second
)

// ConnHandler serves one client connection that arrived over a tunnel;
// the node passes its SSH server's HandleConn. It returns when the
// connection is done.
type ConnHandler func(nc net.Conn)

// AgentConfig configures an Agent.
type AgentConfig struct {
	// ProxyAddr is the proxy's tunnel address (host:port). Required.
	ProxyAddr string
	// Signer is the node's host certificate signer. Required.
	Signer ssh.Signer
	// Algorithms are the key exchanges, ciphers and MACs offered to the
	// proxy; an empty list means sshalgo's default one.
	Algorithms sshalgo.Lists
	// HostCAs returns the cluster's host CA keys; the proxy must present a
	// host certificate of role proxy signed by one, naming ProxyAddr's
	// host. Required.
	HostCAs func() []ssh.PublicKey
	// Handler serves transport channels. Required.
	Handler ConnHandler
	// Dial opens the TCP connection; nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// KeepAliveInterval and KeepAliveCountMax; zero means the defaults.
	KeepAliveInterval time.Duration
	KeepAliveCountMax int
	// ExpectUUID, when set, is the UUID of the proxy this agent was
	// started for (from an announcement): a tunnel server whose host
	// certificate names another proxy is refused.
	ExpectUUID string
	// OnAnnounce receives each announcement of the proxy (on the
	// agent's connection goroutine: it must not block for long). The
	// keep-alive settings in it are applied by the agent itself.
	OnAnnounce func(a *Agent, ann Announcement)
	// OnMove is called when the proxy asks the agent to move first; the
	// agent drops its tunnel when it returns (make before break: the
	// pool opens a tunnel to another proxy first). Nil drops at once.
	OnMove func(ctx context.Context, a *Agent)
	// Deps: Clock times backoff and keep-alives; Metrics holds
	// postern_tunnel_reconnects_total; Audit receives the agent's
	// refusals of a tunnel server (events.AccessDenied, kind "tunnel").
	// Zero fields get observe's defaults.
	observe.Deps
}

// CheckAndSetDefaults validates the config and fills in defaults.
func (c *AgentConfig) CheckAndSetDefaults() error {
	switch {
	case c.ProxyAddr == "":
		return trace.BadParameter("tunnel agent: missing ProxyAddr")
	case c.Signer == nil:
		return trace.BadParameter("tunnel agent: missing Signer")
	case c.HostCAs == nil:
		return trace.BadParameter("tunnel agent: missing HostCAs")
	case c.Handler == nil:
		return trace.BadParameter("tunnel agent: missing Handler")
	}
	if _, _, err := net.SplitHostPort(c.ProxyAddr); err != nil {
		return trace.BadParameter("tunnel agent: proxy address %q: %v", c.ProxyAddr, err)
	}
	if c.Dial == nil {
		c.Dial = (&net.Dialer{}).DialContext
	}
	if c.KeepAliveInterval == 0 {
		c.KeepAliveInterval = DefaultKeepAliveInterval
	}
	if c.KeepAliveCountMax == 0 {
		c.KeepAliveCountMax = DefaultKeepAliveCountMax
	}
	c.Deps.SetDefaults(observe.ComponentTunnelAgent)
	return nil
}

// Agent keeps one tunnel to one proxy, reconnecting with backoff. It owns
// its run loop and, per connection, the channel handlers; Close stops and
// waits for all of them.
type Agent struct {
	cfg        AgentConfig
	reconnects prometheus.Counter
	ctx        context.Context
	cancel     context.CancelFunc
	done       chan struct{}

	// mu guards conn, the current tunnel (nil between connections), and
	// up, closed (and replaced) each time a tunnel comes up.
	mu   sync.Mutex
	conn ssh.Conn
	up   chan struct{}
	// moving is the current tunnel once its proxy asked it to move:
	// nothing new (an auth connection) should start on it.
	moving ssh.Conn
	// proxyUUID is the KeyId of the proxy certificate of the current (or
	// last) tunnel.
	proxyUUID string
	// kaInterval and kaCount are the keep-alive settings the proxy last
	// announced (zero: the config's).
	kaInterval atomic.Int64
	kaCount    atomic.Int64
	// noDataUntil (UnixNano of cfg.Clock) is when the agent next tries
	// a data connection after one failed: see transport.
	noDataUntil atomic.Int64
}

// NewAgent returns an Agent; call Start.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "postern", Name: "tunnel_reconnects_total",
		Help: "Times a tunnel agent reconnected to a proxy after losing or failing to open its tunnel.",
	})
	c, err := promreg.Register(cfg.Metrics, c)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	// The agent owns its tunnels' lifetime (Close ends it): no caller's context.
	ctx, cancel := context.WithCancel(context.Background())
	return &Agent{cfg: cfg, reconnects: c, ctx: ctx, cancel: cancel, done: make(chan struct{}), up: make(chan struct{})}, nil
}

// Start runs the agent until Close.
func (a *Agent) Start() { go a.run() }

// Close stops the agent, closes its tunnel and waits.
func (a *Agent) Close() error {
	a.cancel()
	a.mu.Lock()
	if a.conn != nil {
		_ = a.conn.Close()
	}
	a.mu.Unlock()
	<-a.done
	return nil
}

// Done is closed when the agent has stopped.
func (a *Agent) Done() <-chan struct{} { return a.done }

// DropTunnel closes the current tunnel (if any): the agent reconnects as
// after any loss. Operators and tests use it; nothing else should.
func (a *Agent) DropTunnel() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		_ = a.conn.Close()
	}
}

func (a *Agent) run() {
	defer close(a.done)
	backoff := backoff.Backoff{Min: initialBackoff, Max: maxBackoff, Jitter: true}
	for first := true; ; first = false {
		if !first {
			a.reconnects.Inc()
		}
		connected, err := a.connectAndServe()
		if a.ctx.Err() != nil {
			return
		}
		if connected {
			// A tunnel that lived starts the backoff afresh.
			backoff.Reset()
		}
		wait := backoff.Next()
		a.cfg.Logger.WithError(err).WithField("retry_in", wait.String()).Warn("Tunnel to the proxy lost; reconnecting.")
		select {
		case <-a.cfg.Clock.After(wait):
		case <-a.ctx.Done():
			return
		}
	}
}

// checkProxy accepts only a proxy's host certificate of this cluster
// naming the address dialed: a node's certificate (another node
// pretending to be the proxy) is refused.
func (a *Agent) checkProxy(addr string, remote net.Addr, key ssh.PublicKey) error {
	err := a.verifyProxy(addr, key)
	if err != nil {
		reason := "the tunnel server at " + addr + " is not a proxy of this cluster: " + trace.UserMessage(err)
		if errors.Is(err, errUnnamedAddr) {
			reason = "the tunnel server at " + addr + " was refused: " + trace.UserMessage(err)
		}
		a.cfg.Logger.WithField("proxy", addr).Warn(reason)
		a.cfg.Audit.Emit(a.ctx, events.Event{
			Type: events.AccessDenied,
			Fields: events.Fields{
				events.FieldKind: "tunnel", events.FieldRemoteAddr: remote.String(), events.FieldReason: reason,
			},
		})
	}
	return err
}

func (a *Agent) verifyProxy(addr string, key ssh.PublicKey) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	cas := a.cfg.HostCAs()
	if err := authz.CheckHostCert(cas, host, key, a.cfg.Clock); err != nil {
		if cert, ok := key.(*ssh.Certificate); ok && !slices.Contains(cert.ValidPrincipals, host) && signedByOneOf(cert, cas) {
			// A proxy of this cluster, dialed at an address its
			// certificate lacks: x/crypto's "principal not in the set of
			// valid principals" does not say what to change.
			return trace.Wrap(fmt.Errorf("%w %q, the address this node dialed (it names %s); "+
				"a proxy's certificate names its listen addresses and public_addrs: add %q to the proxy's public_addrs, or point the node at a name the proxy has",
				errUnnamedAddr, host, strings.Join(cert.ValidPrincipals, ", "), host))
		}
		return trace.Wrap(err)
	}
	cert := key.(*ssh.Certificate)
	if role := cert.Extensions[services.CertExtensionHostRole]; role != RoleProxy {
		return trace.AccessDenied("the tunnel server's host certificate has role %q, not %q", role, RoleProxy)
	}
	if a.cfg.ExpectUUID != "" && cert.KeyId != a.cfg.ExpectUUID {
		return trace.AccessDenied("the tunnel server at %s is proxy %q, not the announced %q", addr, cert.KeyId, a.cfg.ExpectUUID)
	}
	a.mu.Lock()
	a.proxyUUID = cert.KeyId
	a.mu.Unlock()
	return nil
}

// errUnnamedAddr: a proxy of this cluster whose certificate lacks the
// address the node dialed.
var errUnnamedAddr = errors.New("the proxy's host certificate does not name")

// signedByOneOf reports whether cert's signing key is one of cas.
func signedByOneOf(cert *ssh.Certificate, cas []ssh.PublicKey) bool {
	for _, ca := range cas {
		if bytes.Equal(ca.Marshal(), cert.SignatureKey.Marshal()) {
			return true
		}
	}
	return false
}

// ProxyUUID is the UUID of the proxy the agent's tunnel reached last
// ("" before the first).
func (a *Agent) ProxyUUID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proxyUUID
}

// ProxyAddr is the tunnel address this agent dials.
func (a *Agent) ProxyAddr() string { return a.cfg.ProxyAddr }

// Connected reports whether a tunnel is up now.
func (a *Agent) Connected() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn != nil
}

// usable reports whether a tunnel is up and not moving away.
func (a *Agent) usable() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn != nil && a.conn != a.moving
}

// keepAlive is the keep-alive setting in force: the proxy's last
// announcement, else the config's.
func (a *Agent) keepAlive() (time.Duration, int) {
	return time.Duration(a.kaInterval.Load()), int(a.kaCount.Load())
}

// handleRequests serves the proxy's global requests on one tunnel.
func (a *Agent) handleRequests(sconn ssh.Conn, reqs <-chan *ssh.Request, wg *sync.WaitGroup, d *drainer) {
	for req := range reqs {
		switch req.Type {
		case RequestAnnounce:
			ann, err := parseAnnouncement(req.Payload)
			if err != nil {
				a.cfg.Logger.WithError(err).Warn("Ignoring the proxy's announcement.")
				break
			}
			oldI, oldC := a.kaInterval.Swap(int64(ann.KeepAliveInterval)), a.kaCount.Swap(int64(ann.KeepAliveCountMax))
			if oldI != int64(ann.KeepAliveInterval) || oldC != int64(ann.KeepAliveCountMax) {
				a.cfg.Logger.WithFields(logrus.Fields{
					"proxy": a.cfg.ProxyAddr, "keep_alive_interval": ann.KeepAliveInterval.String(), "keep_alive_count_max": ann.KeepAliveCountMax,
				}).Info("Tunnel keep-alive settings from the proxy.")
			}
			if a.cfg.OnAnnounce != nil {
				a.cfg.OnAnnounce(a, ann)
			}
		case RequestMove:
			if req.WantReply {
				_ = req.Reply(true, nil)
			}
			a.mu.Lock()
			a.moving = sconn
			a.mu.Unlock()
			a.cfg.Logger.WithField("proxy", a.cfg.ProxyAddr).Info("The proxy asks this agent to move; opening a tunnel elsewhere first.")
			wg.Add(1)
			go func() {
				defer wg.Done()
				if a.cfg.OnMove != nil {
					ctx, cancel := context.WithTimeout(a.ctx, DefaultHandshakeTimeout)
					a.cfg.OnMove(ctx, a)
					cancel()
				}
				// Sessions on this tunnel go on until they end.
				d.drain()
			}()
			continue
		}
		if req.WantReply {
			_ = req.Reply(false, nil)
		}
	}
}

func (a *Agent) connectAndServe() (connected bool, err error) {
	dctx, cancel := context.WithTimeout(a.ctx, DefaultHandshakeTimeout)
	defer cancel()
	nc, err := a.cfg.Dial(dctx, "tcp", a.cfg.ProxyAddr)
	if err != nil {
		return false, trace.ConnectionProblem(err, "dialing the proxy's tunnel port %s: %v", a.cfg.ProxyAddr, err)
	}
	_ = nc.SetDeadline(time.Now().Add(DefaultHandshakeTimeout))
	sconn, chans, reqs, err := ssh.NewClientConn(nc, a.cfg.ProxyAddr, a.cfg.Algorithms.ClientConfig(&ssh.ClientConfig{
		User:            "tunnel",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(a.cfg.Signer)},
		HostKeyCallback: a.checkProxy,
		ClientVersion:   "SSH-2.0-postern-tunnel-agent",
	}))
	if err != nil {
		_ = nc.Close()
		return false, trace.ConnectionProblem(err, "tunnel handshake with %s: %v", a.cfg.ProxyAddr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	a.mu.Lock()
	if a.ctx.Err() != nil {
		a.mu.Unlock()
		_ = sconn.Close()
		return false, trace.Wrap(a.ctx.Err())
	}
	a.conn = sconn
	close(a.up)
	a.up = make(chan struct{})
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.conn = nil
		a.mu.Unlock()
	}()
	a.cfg.Logger.WithField("proxy", a.cfg.ProxyAddr).Info("Tunnel to the proxy is up.")
	ka := utils.StartSSHKeepAlive(sconn, "proxy "+a.cfg.ProxyAddr, utils.SSHKeepAliveConfig{
		Interval: a.cfg.KeepAliveInterval, CountMax: a.cfg.KeepAliveCountMax, Clock: a.cfg.Clock,
		Params: a.keepAlive, FromLastAnswer: true,
	})
	var wg sync.WaitGroup
	d := &drainer{conn: sconn}
	tunnelDone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.handleRequests(sconn, reqs, &wg, d)
	}()
	for nch := range chans {
		if nch.ChannelType() != ChannelTransport {
			_ = nch.Reject(ssh.UnknownChannelType, "unknown channel type")
			continue
		}
		req, ok := parseTransportRequest(nch.ExtraData())
		if !ok {
			_ = nch.Reject(ssh.ConnectionFailed, "malformed transport request")
			continue
		}
		var meta observe.DialMeta
		if req.Meta != nil {
			// Bad metadata costs the trace or the id, not the session.
			var merr error
			if meta, merr = req.Meta.Sanitize(); merr != nil {
				a.cfg.Logger.WithError(merr).Warn("Ignoring malformed dial metadata from the proxy.")
			}
		}
		if !d.begin() {
			_ = nch.Reject(ssh.ConnectionFailed, "this tunnel is moving to another proxy")
			continue
		}
		ch, creqs, err := nch.Accept()
		if err != nil {
			d.end()
			continue
		}
		go ssh.DiscardRequests(creqs)
		tunnelLocal := nc.LocalAddr()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer d.end()
			a.cfg.Handler(a.transport(ch, req, meta, tunnelLocal, tunnelDone))
		}()
	}
	ka.Close()
	_ = sconn.Close()
	// Data connections end with their tunnel, as channels do.
	close(tunnelDone)
	wg.Wait()
	return true, trace.Wrap(errors.Join(ka.Err(), sconn.Wait()))
}

// dataConnTimeout bounds opening a data connection (the dial, the token,
// the proxy's answer) before the agent serves the transport in-band.
const dataConnTimeout = 5 * time.Second

// dataConnRetry is how long an agent whose data connection failed serves
// transports in-band before it tries again. Where the tunnel address
// cannot take them (a load balancer that spreads connections over
// proxies: the token is another proxy's), every try would cost a session
// a round trip, a warning here and a refusal audited there.
const dataConnRetry = time.Minute

// transport is what the node's server serves a transport channel on: the
// data connection the proxy offered (conn.go), else the channel itself,
// which the proxy is then told (RequestInBand).
func (a *Agent) transport(ch ssh.Channel, req TransportRequest, meta observe.DialMeta, tunnelLocal net.Addr, tunnelDone <-chan struct{}) net.Conn {
	if req.DataToken != "" && a.cfg.Clock.Now().UnixNano() >= a.noDataUntil.Load() {
		nc, err := a.dialData(req.DataToken)
		if err == nil {
			local, remote := transportAddrs(req, nc.LocalAddr())
			// The proxy closes the channel (conn.go).
			dc := newDataConn(nc, tunnelDone, local, remote)
			dc.meta = meta
			return dc
		}
		a.noDataUntil.Store(a.cfg.Clock.Now().Add(dataConnRetry).UnixNano())
		a.cfg.Logger.WithError(err).WithFields(logrus.Fields{"proxy": a.cfg.ProxyAddr, "retry_in": dataConnRetry.String()}).Warn("No data connection to the proxy; carrying connections inside the tunnel for now.")
	}
	if _, err := ch.SendRequest(RequestInBand, false, nil); err != nil {
		_ = ch.Close()
	}
	c := transportConn(ch, req, tunnelLocal)
	c.meta = meta
	return c
}

// dialData opens a data connection: the tunnel port again, the magic and
// the token, and the proxy's one-byte answer that it took the token.
func (a *Agent) dialData(hexToken string) (net.Conn, error) {
	token, err := hex.DecodeString(hexToken)
	if err != nil || len(token) != dataTokenSize {
		return nil, trace.BadParameter("the proxy offered a malformed data token")
	}
	ctx, cancel := context.WithTimeout(a.ctx, dataConnTimeout)
	defer cancel()
	nc, err := a.cfg.Dial(ctx, "tcp", a.cfg.ProxyAddr)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "dialing %s for a data connection: %v", a.cfg.ProxyAddr, err)
	}
	// A socket deadline is real time (see channelConn.SetDeadline).
	_ = nc.SetDeadline(time.Now().Add(dataConnTimeout))
	// Closing nc when ctx ends (the agent is closing) interrupts the
	// wait for the answer.
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	var ack [1]byte
	if _, err = nc.Write(append([]byte(dataConnMagic), token...)); err == nil {
		_, err = io.ReadFull(nc, ack[:])
	}
	if err == nil && ack[0] != dataConnAck {
		err = trace.BadParameter("unexpected answer %#x", ack[0])
	}
	if err != nil || !stop() {
		_ = nc.Close()
		return nil, trace.ConnectionProblem(err, "the proxy at %s did not take the data connection: %v", a.cfg.ProxyAddr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, nil
}

// DialAuth opens a connection to the auth API through the current tunnel
// (ChannelAuth): a node behind NAT gives it to its auth client as Dial.
// ConnectionProblem while no tunnel is up.
func (a *Agent) DialAuth(ctx context.Context, _, _ string) (net.Conn, error) {
	a.mu.Lock()
	conn := a.conn
	a.mu.Unlock()
	if conn == nil {
		return nil, trace.ConnectionProblem(nil, "no tunnel to the proxy %s yet", a.cfg.ProxyAddr)
	}
	ch, reqs, err := conn.OpenChannel(ChannelAuth, nil)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "opening an auth channel through the tunnel to %s: %v", a.cfg.ProxyAddr, err)
	}
	go ssh.DiscardRequests(reqs)
	return newChannelConn(ch, "node", "auth-via-"+a.cfg.ProxyAddr), nil
}

// WaitConnected blocks until a tunnel is up or ctx ends.
func (a *Agent) WaitConnected(ctx context.Context) error {
	for {
		a.mu.Lock()
		conn, up := a.conn, a.up
		a.mu.Unlock()
		if conn != nil {
			return nil
		}
		select {
		case <-up:
		case <-ctx.Done():
			return trace.ConnectionProblem(ctx.Err(), "no tunnel to the proxy %s: %v", a.cfg.ProxyAddr, context.Cause(ctx))
		case <-a.done:
			return trace.ConnectionProblem(nil, "the tunnel agent stopped")
		}
	}
}

// drainer closes a tunnel once it is draining (the proxy asked the agent
// to move) and its last transport channel has ended.
type drainer struct {
	conn ssh.Conn
	// mu guards active and draining.
	mu       sync.Mutex
	active   int
	draining bool
}

// begin counts a new channel; false once draining (refuse it).
func (d *drainer) begin() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.draining {
		return false
	}
	d.active++
	return true
}

func (d *drainer) end() {
	d.mu.Lock()
	d.active--
	closeNow := d.draining && d.active == 0
	d.mu.Unlock()
	if closeNow {
		_ = d.conn.Close()
	}
}

func (d *drainer) drain() {
	d.mu.Lock()
	d.draining = true
	closeNow := d.active == 0
	d.mu.Unlock()
	if closeNow {
		_ = d.conn.Close()
	}
}
