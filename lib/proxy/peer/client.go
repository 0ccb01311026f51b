package peer

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/hashicorp/yamux"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// Locator says which proxies hold a tunnel from a node;
// *services.TunnelLocator is the production one.
type Locator interface {
	Holders(node, exclude string) []services.TunnelConnection
	Located(node string) <-chan struct{}
}

var _ Locator = (*services.TunnelLocator)(nil)

// DefaultDialTimeout bounds connecting to a peer (TCP, TLS) and a peer's
// answer to a dial request.
const DefaultDialTimeout = 10 * time.Second

// ClientConfig configures a Client.
type ClientConfig struct {
	Identity
	// Locator finds the peers holding a node's tunnel. Required.
	Locator Locator
	// DialTimeout: zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// Deps: Audit receives refusals of peers that are not who their
	// lease says (events.AccessDenied, kind "peer"); Clock checks peer
	// certificates. Zero fields get observe's defaults.
	observe.Deps
}

// CheckAndSetDefaults validates the config.
func (c *ClientConfig) CheckAndSetDefaults() error {
	if err := c.Identity.check(); err != nil {
		return trace.Wrap(err)
	}
	if c.Locator == nil {
		return trace.BadParameter("peer client: missing Locator")
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	c.Deps.SetDefaults(observe.ComponentPeerClient)
	return nil
}

// Client dials nodes through peer proxies: one multiplexed connection per
// peer, opened on first use, replaced when it breaks, one stream per dial.
// It is the Router's proxy.PeerDialer.
type Client struct {
	cfg ClientConfig

	// mu guards conns and closed.
	mu     sync.Mutex
	conns  map[string]*peerConn
	closed bool
}

// peerConn is the connection to one peer; ready is closed once sess (or
// err) is set, so concurrent dials share one handshake.
type peerConn struct {
	uuid, addr string
	ready      chan struct{}
	sess       *yamux.Session
	err        error
	// v2: the peer negotiated ALPNv2, so its DialRequests may carry
	// Meta.
	v2 bool
}

// NewClient returns a Client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	return &Client{cfg: cfg, conns: map[string]*peerConn{}}, nil
}

// PeerHolders lists the peers (proxy UUIDs, newest lease first) that hold
// a tunnel from node, this proxy left out.
func (c *Client) PeerHolders(node string) []string {
	hs := c.cfg.Locator.Holders(node, c.cfg.UUID)
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		if h.PeerAddr != "" {
			out = append(out, h.ProxyUUID)
		}
	}
	return out
}

// PeerLocated is closed when a lease for node is next written.
func (c *Client) PeerLocated(node string) <-chan struct{} { return c.cfg.Locator.Located(node) }

func (c *Client) peerAddr(proxyUUID, node string) (string, error) {
	for _, h := range c.cfg.Locator.Holders(node, c.cfg.UUID) {
		if h.ProxyUUID == proxyUUID && h.PeerAddr != "" {
			return h.PeerAddr, nil
		}
	}
	return "", trace.NotFound("proxy %q holds no tunnel from node %q any more", proxyUUID, node)
}

// DialPeer asks proxy proxyUUID to dial node over its tunnel and returns
// the connection (raw bytes from the node's SSH server on). Errors:
// NotFound when the peer holds no tunnel from node (a stale lease),
// AccessDenied when the peer is not who it should be, ConnectionProblem
// otherwise.
func (c *Client) DialPeer(ctx context.Context, proxyUUID, node, source, destination string) (net.Conn, error) {
	req := DialRequest{NodeUUID: node, Source: source, Destination: destination}
	meta := observe.MetaFromContext(ctx)
	if err := req.Check(); err != nil {
		return nil, trace.Wrap(err)
	}
	addr, err := c.peerAddr(proxyUUID, node)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	sess, err := c.session(ctx, proxyUUID, addr)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if meta != (observe.DialMeta{}) && c.carriesMeta(proxyUUID, sess) {
		req.Meta = &meta
	}
	st, err := sess.OpenStream()
	if err != nil {
		c.drop(proxyUUID, sess)
		return nil, trace.ConnectionProblem(err, "opening a stream to peer proxy %q (%s): %v", proxyUUID, addr, err)
	}
	sc := newStreamConn(st)
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Unix(1, 0)) })
	err = writeFrame(st, req)
	var resp DialResponse
	if err == nil {
		err = readFrame(st, &resp)
	}
	if !stop() {
		_ = sc.Close()
		return nil, trace.ConnectionProblem(context.Cause(ctx), "peer proxy %q (%s) did not answer the dial for node %q: %v", proxyUUID, addr, node, context.Cause(ctx))
	}
	if err != nil {
		_ = sc.Close()
		return nil, trace.ConnectionProblem(err, "dial through peer proxy %q (%s) failed: %v", proxyUUID, addr, err)
	}
	if err := resp.Err(); err != nil {
		_ = sc.Close()
		return nil, trace.Wrap(err, "peer proxy %q", proxyUUID)
	}
	return sc, nil
}

// session returns the live connection to peer uuid at addr, dialing it if
// there is none (or the one there broke, or the peer moved).
func (c *Client) session(ctx context.Context, uuid, addr string) (*yamux.Session, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, trace.ConnectionProblem(nil, "peer client is closed")
	}
	pc := c.conns[uuid]
	if pc != nil {
		select {
		case <-pc.ready:
			if pc.err != nil || pc.sess.IsClosed() || pc.addr != addr {
				if pc.sess != nil {
					_ = pc.sess.Close()
				}
				pc = nil
			}
		default:
		}
	}
	if pc == nil {
		pc = &peerConn{uuid: uuid, addr: addr, ready: make(chan struct{})}
		c.conns[uuid] = pc
		go c.connect(pc)
	}
	c.mu.Unlock()
	select {
	case <-pc.ready:
		if pc.err != nil {
			return nil, pc.err
		}
		return pc.sess, nil
	case <-ctx.Done():
		return nil, trace.ConnectionProblem(context.Cause(ctx), "connecting to peer proxy %q (%s): %v", uuid, addr, context.Cause(ctx))
	}
}

// connect dials one peer. It runs on its own so that the caller that
// started it can give up (its context) without failing the others.
func (c *Client) connect(pc *peerConn) {
	// The connection is shared by every dial to this peer, not owned by
	// the one that started it (which may give up): its own timeout only.
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.DialTimeout)
	defer cancel()
	sess, v2, err := c.dialSession(ctx, pc.uuid, pc.addr)
	c.mu.Lock()
	pc.sess, pc.err, pc.v2 = sess, err, v2
	if err != nil && c.conns[pc.uuid] == pc {
		// The next dial tries again.
		delete(c.conns, pc.uuid)
	}
	if c.closed && sess != nil {
		_ = sess.Close()
	}
	c.mu.Unlock()
	close(pc.ready)
}

// carriesMeta reports whether sess, peer uuid's connection, negotiated
// ALPNv2 (an older peer refuses a DialRequest with a field it does not
// know).
func (c *Client) carriesMeta(uuid string, sess *yamux.Session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := c.conns[uuid]
	return pc != nil && pc.sess == sess && pc.v2
}

func (c *Client) dialSession(ctx context.Context, uuid, addr string) (*yamux.Session, bool, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, trace.ConnectionProblem(err, "connecting to peer proxy %q at %s: %v", uuid, addr, err)
	}
	cert := c.cfg.Certificate
	tc := tls.Client(nc, &tls.Config{
		// verifyPeer checks the chain, role, cluster and UUID; there is
		// no host name to check (see the package doc).
		InsecureSkipVerify: true,
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{ALPNv2},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := verifyPeer(cs, c.cfg.CAPool(), c.cfg.ClusterName, uuid, c.cfg.Clock.Now())
			return err
		},
	})
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		if trace.IsAccessDenied(err) {
			c.cfg.Logger.WithError(err).WithFields(logrus.Fields{"peer": uuid, "addr": addr}).Warn("Peer is not who its lease says.")
			c.cfg.Audit.Emit(ctx, events.Event{Type: events.AccessDenied, Fields: events.Fields{
				events.FieldKind: "peer", events.FieldServerID: uuid, events.FieldAddr: addr,
				events.FieldReason: trace.UserMessage(err),
			}})
			return nil, false, trace.Wrap(err)
		}
		return nil, false, trace.ConnectionProblem(err, "TLS with peer proxy %q at %s: %v", uuid, addr, err)
	}
	sess, err := yamux.Client(&coalescingConn{Conn: tc}, yamuxConfig())
	if err != nil {
		_ = tc.Close()
		return nil, false, trace.Wrap(err)
	}
	return sess, tc.ConnectionState().NegotiatedProtocol == ALPNv2, nil
}

func (c *Client) drop(uuid string, sess *yamux.Session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pc := c.conns[uuid]; pc != nil && pc.sess == sess {
		delete(c.conns, uuid)
	}
	_ = sess.Close()
}

// Close closes every peer connection.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = map[string]*peerConn{}
	c.mu.Unlock()
	for _, pc := range conns {
		<-pc.ready
		if pc.sess != nil {
			_ = pc.sess.Close()
		}
	}
	return nil
}
