package reversetunnel

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/utils"
)

// Channel types on a tunnel. The proxy opens them; the agent serves them.
const (
	// ChannelTransport carries one client connection to the node's own SSH
	// server; its extra data is a TransportRequest.
	ChannelTransport = "postern-transport@postern.dev"
	// ChannelAuth is opened by the node: the proxy splices it, byte for
	// byte, to the auth API, so that a node behind NAT heartbeats and
	// calls auth through its tunnel. The node's mutual TLS runs inside:
	// auth sees the node's own client certificate, and the proxy reads
	// nothing.
	ChannelAuth = "postern-auth@postern.dev"
)

// TransportRequest is the extra data of a ChannelTransport open: who the
// client is and what it asked for, for the node's audit log. It is the
// proxy's word, which the node trusts no more than the proxy itself.
type TransportRequest struct {
	// Source is the client's address as the proxy saw it.
	Source string `json:"src,omitempty"`
	// Destination is the target the client asked for ("host:port").
	Destination string `json:"dst,omitempty"`
	// DataToken, when set, offers a data connection (see dataConn): the
	// node dials the proxy's tunnel port afresh and presents this token
	// (hex), and the client's bytes flow over that plain TCP connection
	// instead of inside the tunnel. Empty: in-band only.
	DataToken string `json:"data,omitempty"`
	// Meta carries the dialing proxy's trace context and connection id
	// to the node (or, on a leaf's tunnel, to the leaf's proxy, whose
	// LeafRequest travels in this channel). Absent from an older proxy;
	// an older node ignores it (encoding/json skips unknown fields, and
	// nodes parse this request leniently for that reason), so the field
	// needs no version of its own.
	Meta *observe.DialMeta `json:"meta,omitempty"`
}

// metaOf is what a dial in ctx sends as TransportRequest.Meta; nil when
// there is nothing to send.
func metaOf(ctx context.Context) *observe.DialMeta {
	m := observe.MetaFromContext(ctx)
	if m == (observe.DialMeta{}) {
		return nil
	}
	return &m
}

// A data connection carries one transport's bytes on a TCP connection of
// its own from the node to the proxy's tunnel port, next to the tunnel
// rather than inside it.
//
// Why: what a transport carries is an SSH connection between the client
// and the node, encrypted and authenticated end to end; in-band, every
// byte of it is encrypted, framed and window-accounted a second time by
// the tunnel's SSH layer, which makes a tunnel node cost the proxy and the
// node half as much CPU again per byte as a node the proxy dials (whose
// hop is plain TCP): measured, a tunnel carried 0.7x the throughput of a
// direct dial on the same machine (BenchmarkJumpTunnelVsDirect), and no
// window or buffer setting changes that; only not doing the second layer
// does. A data connection puts a tunnel node's data path on the footing of
// a direct node's: the same plain TCP hop, protected by the inner SSH
// connection exactly as that hop is.
//
// Trust: the token is 256 random bits the proxy sends only inside the
// tunnel (encrypted, and to the node whose certificate opened it), valid
// for one use and for one dial; the connection is bound to that dial by
// it alone, so the node's identity still comes from the tunnel's
// certificate. A connection with any other token is refused and audited.
// Everything the node needs to know about the client (TransportRequest)
// still comes over the tunnel. Once the data connection is there, the
// proxy closes the transport channel; the connection lives no longer
// than its tunnel, so a tunnel that drops (keep-alive, proxy shutdown,
// agent Close) ends its sessions as before. When the node cannot dial
// back (a load balancer in front of the tunnel port that lands
// elsewhere, a firewall), it says so with RequestInBand and serves the
// transport in the channel (postern_tunnel_transports_total counts
// both).
const (
	// dataConnMagic opens a data connection in place of the "SSH-2.0-"
	// an SSH client sends first: the tunnel port tells them apart by
	// these 8 bytes.
	dataConnMagic = "PSTNDATA"
	// dataTokenSize is the token's length in bytes (hex on the tunnel).
	dataTokenSize = 32
	// dataConnAck is the proxy's one-byte answer to a token it took;
	// the inner SSH stream starts right after it.
	dataConnAck = 0x06
	// RequestInBand is the node's channel request on a transport whose
	// data connection it could not open: the transport is served in
	// the channel.
	RequestInBand = "postern-inband@postern.dev"
)

// prefixConn replays bytes already read from a connection (the tunnel
// port's look at the first 8) before reading on.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// dataConn is a data connection tied to its tunnel: when the tunnel ends
// (keep-alive, proxy shutdown, agent Close) so does the connection, as an
// in-band transport would. A data connection's own end (either side
// closes it) is TCP's, with every byte sent before it delivered. Its
// addresses are the transport's, as for channelConn. One goroutine per
// connection waits for either end.
type dataConn struct {
	net.Conn
	local, remote net.Addr
	// meta is the transport's dial metadata (observe.MetaConn).
	meta      observe.DialMeta
	closeOnce sync.Once
	closed    chan struct{}
}

func newDataConn(nc net.Conn, tunnelDone <-chan struct{}, local, remote net.Addr) *dataConn {
	c := &dataConn{Conn: nc, local: local, remote: remote, closed: make(chan struct{})}
	go func() {
		select {
		case <-tunnelDone:
			// From outside the splice that reads it (the proxy's, to
			// the client's channel): a plain Close would leave a quiet
			// direction of that splice parked for good, and an idle
			// `ssh -J` open until its client hung up, though the tunnel
			// (say, to a stopped node) is gone.
			_ = utils.CloseSpliced(c)
		case <-c.closed:
		}
	}()
	return c
}

func (c *dataConn) LocalAddr() net.Addr  { return c.local }
func (c *dataConn) RemoteAddr() net.Addr { return c.remote }

func (c *dataConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// CloseWrite half-closes the socket, as a splice does a direct node's
// (utils.Splice): the other direction keeps flowing.
func (c *dataConn) CloseWrite() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok {
		return c.Close()
	}
	return cw.CloseWrite()
}

// Unwrap is the TCP connection, for wrappers that tune the socket
// (utils.QuickAckConn), as they do a direct node's.
func (c *dataConn) Unwrap() net.Conn { return c.Conn }

// SyscallConn is the socket's, so that the proxy's splice waits on an
// idle data connection without holding a buffer (utils.readWaiter), as
// it does on a direct node's socket.
// The socket is looked for under the wrappers of the accepted connection
// (the listener's limiter slot): a data connection whose wrapper hid it
// never parked, and its idle sessions each held a goroutine and a buffer.
func (c *dataConn) SyscallConn() (syscall.RawConn, error) {
	for nc := c.Conn; nc != nil; {
		if sc, ok := nc.(syscall.Conn); ok {
			raw, err := sc.SyscallConn()
			return raw, trace.Wrap(err)
		}
		u, ok := nc.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		nc = u.Unwrap()
	}
	return nil, trace.NotImplemented("a data connection over %T has no socket", c.Conn)
}

// DialMeta is the metadata the transport request carried.
func (c *dataConn) DialMeta() observe.DialMeta { return c.meta }

var (
	_ observe.MetaConn = (*dataConn)(nil)
	_ observe.MetaConn = (*channelConn)(nil)
)

// maxTransportRequest bounds the extra data a node parses.
const maxTransportRequest = 4096

func parseTransportRequest(b []byte) (TransportRequest, bool) {
	var r TransportRequest
	if len(b) == 0 {
		return r, true
	}
	if len(b) > maxTransportRequest || json.Unmarshal(b, &r) != nil {
		return TransportRequest{}, false
	}
	return r, true
}

// chanAddr is a net.Addr for a tunnel channel's ends.
type chanAddr string

func (a chanAddr) Network() string { return "tunnel" }
func (a chanAddr) String() string  { return string(a) }

// channelConn makes an SSH channel a net.Conn, so that the node's SSH
// server and the proxy's splice treat a tunnel channel like a socket.
//
// Deadlines: an ssh.Channel has none, and the node's server bounds its
// handshake with SetDeadline. A deadline here closes the channel when it
// passes: coarser than a socket's (the conn is unusable afterwards), but
// every caller in Postern treats a deadline that fires as the end of the
// connection anyway (handshake timeout, banner check).
type channelConn struct {
	ssh.Channel
	local, remote net.Addr
	// meta is the transport's dial metadata (observe.MetaConn).
	meta observe.DialMeta

	// mu guards timer.
	mu    sync.Mutex
	timer *time.Timer
}

func newChannelConn(ch ssh.Channel, local, remote string) *channelConn {
	return &channelConn{Channel: ch, local: chanAddr(local), remote: chanAddr(remote)}
}

// DialMeta is the metadata the transport request carried.
func (c *channelConn) DialMeta() observe.DialMeta { return c.meta }

func (c *channelConn) LocalAddr() net.Addr  { return c.local }
func (c *channelConn) RemoteAddr() net.Addr { return c.remote }

func (c *channelConn) Close() error {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	return c.Channel.Close()
}

// SetDeadline arms (or, with the zero time, disarms) the close. Real
// time on purpose, like a socket deadline: a fake clock cannot interrupt
// a blocked read.
func (c *channelConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if !t.IsZero() {
		c.timer = time.AfterFunc(time.Until(t), func() { _ = c.Channel.Close() })
	}
	return nil
}

func (c *channelConn) SetReadDeadline(t time.Time) error  { return c.SetDeadline(t) }
func (c *channelConn) SetWriteDeadline(t time.Time) error { return c.SetDeadline(t) }

var _ net.Conn = (*channelConn)(nil)

// transportConn is a transport channel as the node's SSH server sees it.
// Its ends are TCP addresses when they can be, as a direct node's are:
// the remote end is the client as the proxy saw it (req.Source), the
// local end is this node's end of the tunnel (tunnelLocal), the socket
// the bytes really arrive on. The server derives SSH_CLIENT and
// SSH_CONNECTION (OpenSSH's session environment, which scripts read and
// which makes bash read ~/.bashrc for a command) and -R's originator
// from *net.TCPAddr ends: with opaque names a tunnel node's sessions
// would lack them and behave unlike a direct node's. A Source that is not
// an IP:port (an older proxy's, or none) stays a name.
func transportConn(ch ssh.Channel, req TransportRequest, tunnelLocal net.Addr) *channelConn {
	c := newChannelConn(ch, req.Destination, req.Source)
	c.local, c.remote = transportAddrs(req, tunnelLocal)
	return c
}

// transportAddrs are a transport's ends as the node's server sees them
// (see transportConn); local is the socket the bytes arrive on.
func transportAddrs(req TransportRequest, local net.Addr) (net.Addr, net.Addr) {
	var l, r net.Addr = chanAddr(req.Destination), chanAddr(req.Source)
	if req.Source == "" {
		r = chanAddr("tunnel")
	}
	if ap, err := netip.ParseAddrPort(req.Source); err == nil {
		r = net.TCPAddrFromAddrPort(ap)
	}
	if la, ok := local.(*net.TCPAddr); ok {
		l = la
	}
	return l, r
}

// Global requests the proxy sends an agent on its tunnel.
const (
	// RequestAnnounce carries an Announcement (JSON): sent when the
	// tunnel registers and whenever what it says changes.
	RequestAnnounce = "postern-announce@postern.dev"
	// RequestMove asks the agent to move first (make before break): the
	// proxy is shutting down. The agent makes sure it has a tunnel to
	// another proxy, then drops this one; the proxy drains once its
	// tunnels are gone (or its grace is over).
	RequestMove = "postern-move@postern.dev"
)

// Announcement is what a tunnel server tells its agents: the cluster's
// tunnel keep-alive settings (cluster_networking_config, applied by both
// ends at once, without reconnecting) and every proxy of the cluster
// with its own tunnel address, so that an agent keeps a tunnel to each
// instead of dialing a load balancer until it lands on the right one.
type Announcement struct {
	// KeepAliveInterval and KeepAliveCountMax: zero means the agent's
	// own defaults.
	KeepAliveInterval time.Duration `json:"keep_alive_interval,omitempty"`
	KeepAliveCountMax int           `json:"keep_alive_count_max,omitempty"`
	// Proxies lists every live proxy, this one included. Nil means the
	// server does not know (it announces no list): agents keep the
	// tunnels they have.
	Proxies []AnnouncedProxy `json:"proxies,omitempty"`
}

// AnnouncedProxy is one proxy in an Announcement.
type AnnouncedProxy struct {
	UUID       string `json:"uuid"`
	TunnelAddr string `json:"tunnel_addr"`
}

// maxAnnouncement bounds what an agent parses: 64 KiB is some hundreds
// of proxies.
const maxAnnouncement = 64 << 10

func parseAnnouncement(b []byte) (Announcement, error) {
	var a Announcement
	if len(b) > maxAnnouncement {
		return a, fmt.Errorf("announcement of %d bytes, at most %d", len(b), maxAnnouncement)
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return Announcement{}, fmt.Errorf("malformed announcement: %v", err)
	}
	if a.KeepAliveInterval < 0 || a.KeepAliveCountMax < 0 {
		return Announcement{}, fmt.Errorf("negative keep-alive settings in the announcement")
	}
	return a, nil
}
