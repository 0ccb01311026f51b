package limiter

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
)

// ListenerOptions configure WrapListener.
type ListenerOptions struct {
	// Rate, when set, also limits how fast one address opens connections.
	Rate *RateLimiter
	// Refusal, when set, returns the bytes written to a refused connection
	// just before it is closed. Nil closes it without a word, which is the
	// only right choice for TLS ports (plaintext would only make the
	// client's TLS stack report garbage); use SSHRefusal for SSH ports.
	Refusal func(err error) []byte
	// OnRefuse, when set, is told about refused connections for the audit
	// log: the first refusal of a source address by one cap, then at most
	// one report per RefusalReportInterval for that address and cap,
	// carrying how many were refused since the last report. A flood from
	// one address costs one report a minute, not one per connection, and
	// a flood from many addresses at most MaxRefusalReportKeys tracked
	// addresses (beyond that, refusals of untracked addresses are reported
	// under the cap alone, with an empty Key). It is called from Accept:
	// it must not block (an audit Emit does not).
	OnRefuse func(Refusal)
	// Handshakes, when set, counts every accepted connection against the
	// limiter's handshake caps (Config.MaxHandshakes, MaxHandshakesPerIP)
	// until the server calls HandshakeDone on it (or it closes), and
	// gives back its Rate token then: only a connection that never
	// authenticates spends the address's rate. For ports whose clients
	// are machines behind shared addresses (the tunnel port: a site of
	// nodes behind one NAT, each with a tunnel and a data connection per
	// session; the peer port), where a per-address cap on everything open
	// would cap a site rather than a client, but what an unauthenticated
	// client holds must stay small.
	Handshakes bool
}

// Refusal is one report of refused connections.
type Refusal struct {
	// Listener is the limiter's Name.
	Listener string
	// Addr is the remote address of the connection that triggered the
	// report; Key the counting key (IPv4 address or IPv6 /64), "" when
	// reported under the cap alone.
	Addr net.Addr
	Key  string
	// Cap is CapIP, CapConnections or CapRate.
	Cap string
	// Err is the refusal, as the client was told.
	Err error
	// Count is how many connections were refused for Key and Cap since
	// the previous report, this one included.
	Count int
}

// RefusalReportInterval is how often OnRefuse hears of one address and
// cap at most, the same cadence as the Warn log of a cap.
const RefusalReportInterval = refusalLogInterval

// MaxRefusalReportKeys bounds the addresses tracked for OnRefuse.
const MaxRefusalReportKeys = 10_000

// refusalWriteTimeout bounds the one write to a refused connection. The
// send buffer of a socket accepted a moment ago is empty, so the write of a
// short message does not block in practice; the deadline only keeps a
// pathological socket from stalling anything.
const refusalWriteTimeout = 100 * time.Millisecond

// refusalLinger is how long a refused connection is drained after the
// refusal was written and the write side shut. Closing a socket that still
// has unread input makes the kernel send a reset, and a client that gets
// the reset before it read the refusal discards it: OpenSSH then prints
// "Connection reset by peer" instead of the reason. Half a second covers a
// client's version line and KEXINIT on any sane link.
const refusalLinger = 500 * time.Millisecond

// maxLingering bounds the refused connections drained at once. Refusals
// come in floods; past this many, a refusal is written and the socket closed
// at once (today's best effort) rather than holding more descriptors and
// goroutines for the flood's sake.
const maxLingering = 64

// SSHRefusal formats a refusal for an SSH port so that a client shows the
// reason without -v. It is three things in a row:
//   - a line before the version string (RFC 4253 section 4.2 lets a server
//     send those; OpenSSH prints them under -v as "banner line 0"). It must
//     not start with "SSH-", or a client would take it for the version;
//   - the server's version string;
//   - an unencrypted SSH_MSG_DISCONNECT packet (RFC 4253 sections 6 and
//     11.1: before the first key exchange the "none" cipher and MAC are in
//     force), reason SSH_DISCONNECT_TOO_MANY_CONNECTIONS. OpenSSH logs it
//     at its default level ("Received disconnect from HOST port P:12:
//     REASON"), and x/crypto's client returns it as the handshake error.
func SSHRefusal(err error) []byte {
	reason := sanitizeLine("postern: " + err.Error())
	out := []byte(reason + "\r\n" + refusalVersion + "\r\n")
	return append(out, disconnectPacket(sshDisconnectTooManyConnections, reason)...)
}

// refusalVersion is the version string of a refusal: "Postern" like the
// real servers', so logs of both look alike.
const refusalVersion = "SSH-2.0-Postern"

// sshDisconnectTooManyConnections is RFC 4253 section 11.1's reason code 12.
const sshDisconnectTooManyConnections = 12

// disconnectPacket is one unencrypted binary packet (RFC 4253 section 6)
// carrying SSH_MSG_DISCONNECT (byte 1, uint32 reason, string description,
// string language tag).
func disconnectPacket(code uint32, description string) []byte {
	payload := []byte{1}
	payload = binary.BigEndian.AppendUint32(payload, code)
	payload = binary.BigEndian.AppendUint32(payload, uint32(len(description)))
	payload = append(payload, description...)
	payload = binary.BigEndian.AppendUint32(payload, 0) // no language tag
	// packet_length || padding_length || payload || padding must be a
	// multiple of 8 (the "none" cipher's block size), with at least 4
	// bytes of padding.
	padding := 8 - (4+1+len(payload))%8
	if padding < 4 {
		padding += 8
	}
	pkt := binary.BigEndian.AppendUint32(nil, uint32(1+len(payload)+padding))
	pkt = append(pkt, byte(padding))
	pkt = append(pkt, payload...)
	return append(pkt, make([]byte, padding)...)
}

// sanitizeLine keeps a refusal on one printable line: the reason may quote
// outside input (an address), and a CR or LF in it would end the line early.
func sanitizeLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// WrapListener applies lim's per-address and total caps (and opts.Rate) at
// accept, before any handshake: a refused connection is closed at once,
// after opts.Refusal's line when set, and Accept goes on to the next one, so
// the server's accept loop never sees a refusal. An accepted connection
// releases its slot when it is closed.
//
// Compose it outside utils.NewRetryingListener, and inside tls.NewListener:
//
//	ln = limiter.WrapListener(utils.NewRetryingListener(raw, ...), lim, opts)
func WrapListener(ln net.Listener, lim *ConnectionLimiter, opts ListenerOptions) net.Listener {
	return &listener{Listener: ln, lim: lim, opts: opts, reports: map[reportKey]*reportState{}}
}

type listener struct {
	net.Listener
	lim  *ConnectionLimiter
	opts ListenerOptions

	// lingering counts refused connections being drained (at most
	// maxLingering); wg waits for their goroutines on Close.
	lingering atomic.Int32
	wg        sync.WaitGroup

	// mu guards reports (only Accept touches it, but a server may call
	// Accept from several goroutines).
	mu        sync.Mutex
	reports   map[reportKey]*reportState
	lastSweep time.Time
}

// Close closes the listener and waits for refused connections still being
// drained (each for at most refusalLinger).
func (l *listener) Close() error {
	err := l.Listener.Close()
	l.wg.Wait()
	return err
}

type reportKey struct{ cap, key string }

type reportState struct {
	last  time.Time
	count int
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.opts.Rate != nil {
			if err := l.opts.Rate.AllowAddr(nc.RemoteAddr()); err != nil {
				l.report(nc.RemoteAddr(), CapRate, err)
				l.refuse(nc, err)
				continue
			}
		}
		release, capName, err := l.lim.acquireIP(nc.RemoteAddr())
		if err != nil {
			l.report(nc.RemoteAddr(), capName, err)
			l.refuse(nc, err)
			continue
		}
		c := &conn{Conn: nc, release: release}
		if l.opts.Handshakes {
			hs, err := l.lim.acquireHandshake(nc.RemoteAddr())
			if err != nil {
				release()
				l.report(nc.RemoteAddr(), CapHandshakes, err)
				l.refuse(nc, err)
				continue
			}
			c.handshake = hs
			if l.opts.Rate != nil {
				addr := nc.RemoteAddr()
				c.refund = func() { l.opts.Rate.refundAddr(addr) }
			}
		}
		return c, nil
	}
}

// report throttles refusals into OnRefuse calls (see ListenerOptions).
func (l *listener) report(addr net.Addr, capName string, err error) {
	if l.opts.OnRefuse == nil {
		return
	}
	_, key := ipKey(addr)
	if capName == CapConnections || capName == CapDescriptors {
		// The total cap and the budget are not about one address: one
		// report per interval for the listener.
		key = ""
	}
	now := l.lim.cfg.Clock.Now()
	l.mu.Lock()
	k := reportKey{capName, key}
	st := l.reports[k]
	if st == nil && len(l.reports) >= MaxRefusalReportKeys {
		// Forget addresses not reported for an interval (their next
		// refusal is reported at once again), at most once per interval:
		// under a flood from many addresses the sweep must not cost every
		// accept a pass over the map.
		if now.Sub(l.lastSweep) >= RefusalReportInterval {
			l.lastSweep = now
			for rk, s := range l.reports {
				if now.Sub(s.last) >= RefusalReportInterval {
					delete(l.reports, rk)
				}
			}
		}
		if len(l.reports) >= MaxRefusalReportKeys {
			k = reportKey{capName, ""}
			key = ""
			st = l.reports[k]
		}
	}
	if st == nil {
		// The first refusal is reported at once.
		st = &reportState{}
		l.reports[k] = st
	} else if now.Sub(st.last) < RefusalReportInterval {
		st.count++
		l.mu.Unlock()
		return
	}
	count := st.count + 1
	st.last, st.count = now, 0
	l.mu.Unlock()
	l.opts.OnRefuse(Refusal{Listener: l.lim.Name(), Addr: addr, Key: key, Cap: capName, Err: err, Count: count})
}

func (l *listener) refuse(nc net.Conn, err error) {
	if l.opts.Refusal == nil {
		_ = nc.Close()
		return
	}
	msg := l.opts.Refusal(err)
	// Socket deadlines, not the Clock: only the kernel can interrupt a
	// blocked write or read.
	_ = nc.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
	if _, werr := nc.Write(msg); werr != nil || l.lingering.Add(1) > maxLingering {
		if werr == nil {
			l.lingering.Add(-1)
		}
		_ = nc.Close()
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer l.lingering.Add(-1)
		linger(nc)
	}()
}

// linger shuts the write side of a refused connection, then reads and
// drops what the client still sends until it closes or refusalLinger
// passes, so that closing does not reset the connection before the client
// read the refusal (see refusalLinger).
func linger(nc net.Conn) {
	defer nc.Close()
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = nc.SetReadDeadline(time.Now().Add(refusalLinger))
	_, _ = io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
}

// conn releases its limiter slot on Close.
type conn struct {
	net.Conn
	release func()
	once    sync.Once
	// handshake, when set, releases the connection's handshake slot;
	// refund gives back its rate token (see ListenerOptions.Handshakes).
	// Both run at most once, handshake on HandshakeDone or Close, refund
	// only on HandshakeDone.
	handshake, refund func()
	hsOnce            sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.endHandshake(false)
	c.once.Do(c.release)
	return err
}

func (c *conn) endHandshake(done bool) {
	if c.handshake == nil {
		return
	}
	c.hsOnce.Do(func() {
		c.handshake()
		if done && c.refund != nil {
			c.refund()
		}
	})
}

// HandshakeDone tells the limiter that nc, accepted through a listener
// wrapped with ListenerOptions.Handshakes, has authenticated: it no longer
// counts against the handshake caps, and its rate token is given back. nc
// may be the accepted connection or anything wrapping it that unwraps to
// it (Unwrap() net.Conn, or NetConn() net.Conn as *tls.Conn has); on any
// other connection it does nothing. Calling it twice is harmless.
func HandshakeDone(nc net.Conn) {
	for nc != nil {
		switch c := nc.(type) {
		case *conn:
			c.endHandshake(true)
			return
		case interface{ Unwrap() net.Conn }:
			nc = c.Unwrap()
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return
		}
	}
}

// CloseWrite half-closes when the underlying connection can (a TCP
// connection can), and closes it otherwise: to a splice, a connection that
// cannot half-close is closed outright either way.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// Unwrap returns the underlying connection.
func (c *conn) Unwrap() net.Conn { return c.Conn }

// HTTPMiddleware refuses a request with 429 Too Many Requests and the
// reason as `{"error": "..."}` (lib/web's error shape) when acquire fails
// with trace.LimitExceeded, holds the slot for the request's duration
// (including a websocket's whole life: its handler returns when it ends),
// and passes other errors through as 503. Use it for caps a TCP-level
// limiter cannot see: one HTTP/2 connection multiplexes many requests, and
// only a handler knows the user, e.g.
//
//	limiter.HTTPMiddleware(h, func(r *http.Request) (func(), error) {
//		return lim.AcquireSession(userOf(r))
//	})
func HTTPMiddleware(next http.Handler, acquire func(r *http.Request) (release func(), err error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, err := acquire(r)
		if err != nil {
			code := http.StatusServiceUnavailable
			if trace.IsLimitExceeded(err) {
				code = http.StatusTooManyRequests
				// The caps free up as sessions end; a second is the
				// smallest unit Retry-After has.
				w.Header().Set("Retry-After", strconv.Itoa(1))
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": trace.UserMessage(err)})
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// RemoteAddr is the net.Addr of an HTTP request's peer, for AcquireIP in an
// HTTPMiddleware acquire func.
func RemoteAddr(r *http.Request) net.Addr { return stringAddr(r.RemoteAddr) }
