package auth

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gravitational/trace"
)

// Relayed joins. A host that reaches only the proxy joins through the
// proxy's join relay (lib/web/joinrelay.go): a byte pipe over which the
// host runs its own pinned TLS to auth. If the pipe were plain TCP, auth
// would see every relayed join coming from the proxy's address, and the
// per-address join limiter would lock the proxy's address out after an
// attacker's few failed joins: every host joining through that proxy
// would be refused (a DoS), and the attacker's budget would be everyone's.
//
// So the proxy opens the pipe as itself: an mTLS request with its proxy
// identity, GET /v1/join-relay with the client's address in
// JoinRelayClientHeader. The role check admits proxies only, so the header
// is believed from a proxy and nobody else. Auth hijacks the connection
// and serves the host's inner TLS on it as a join connection whose remote
// address is the client's: the limiter, the audit log and RegisterUsingToken
// all see the host's own address.

// JoinRelayClientHeader carries the joining client's address (host:port,
// as the proxy saw it) on GET /v1/join-relay.
const JoinRelayClientHeader = "X-Postern-Client-Addr"

// joinRelayUpgrade is the Upgrade token of the relay on the auth side.
const joinRelayUpgrade = "postern-join-relay"

// relayedConn is a relayed join's connection: the proxy's mTLS stream,
// whose far end is the joining client.
type relayedConn struct {
	net.Conn
	remote net.Addr
}

func (c *relayedConn) RemoteAddr() net.Addr { return c.remote }

// relayListener hands relayed connections to the API's http.Server.
type relayListener struct {
	addr  net.Addr
	conns chan net.Conn
	// mu guards closed (a send after close would panic).
	mu     sync.Mutex
	closed bool
	done   chan struct{}
}

func newRelayListener(addr net.Addr) *relayListener {
	return &relayListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *relayListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *relayListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
	return nil
}

func (l *relayListener) Addr() net.Addr { return l.addr }

// pushContext hands c to Accept; false (and c closed) once closed or
// when ctx ends first.
func (l *relayListener) pushContext(ctx context.Context, c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
	case <-ctx.Done():
	}
	_ = c.Close()
	return false
}

// joinRelay serves GET /v1/join-relay for a proxy (the role check ran).
func (a *APIServer) joinRelay(w http.ResponseWriter, r *http.Request, p *peer) {
	if r.Header.Get("Upgrade") != joinRelayUpgrade {
		writeError(w, trace.BadParameter("the join relay needs the header Upgrade: %s", joinRelayUpgrade))
		return
	}
	client := r.Header.Get(JoinRelayClientHeader)
	host, port, err := net.SplitHostPort(client)
	ip := net.ParseIP(host)
	if err != nil || ip == nil || port == "" {
		writeError(w, trace.BadParameter("%s %q: want the client's IP:port", JoinRelayClientHeader, client))
		return
	}
	remote := &net.TCPAddr{IP: ip, Zone: ""}
	if tcp, err := net.ResolveTCPAddr("tcp", client); err == nil {
		remote = tcp
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeError(w, trace.BadParameter("the join relay needs HTTP/1.1"))
		return
	}
	nc, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	if _, err := rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + joinRelayUpgrade + "\r\nConnection: Upgrade\r\n\r\n"); err != nil || rw.Flush() != nil || rw.Reader.Buffered() > 0 {
		// The client speaks only after the 101.
		_ = nc.Close()
		return
	}
	_ = nc.SetDeadline(time.Time{})
	a.log.WithFields(map[string]any{"proxy": p.ID, "client": remote.String()}).Debug("Relaying a join.")
	// The request's context: the hijacked handler waits here until
	// Accept takes the connection.
	a.relayLn.pushContext(r.Context(), &relayedConn{Conn: nc, remote: remote})
}

// DialJoinRelay opens the auth side of a relayed join for the proxy
// holding id: an mTLS connection over raw (the bytes to the auth API,
// closed on failure) upgraded to a pipe that auth serves as a join
// connection from client. The joining host's own TLS runs inside.
func DialJoinRelay(ctx context.Context, raw net.Conn, id *Identity, client string) (net.Conn, error) {
	cfg := id.ClientTLSConfig()
	cfg.NextProtos = []string{"http/1.1"}
	tc := tls.Client(raw, cfg)
	if dl, ok := ctx.Deadline(); ok {
		_ = tc.SetDeadline(dl)
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, trace.ConnectionProblem(err, "join relay: TLS to the auth API: %v", err)
	}
	req := "GET /v1/join-relay HTTP/1.1\r\nHost: " + AuthServerName + "\r\nUpgrade: " + joinRelayUpgrade +
		"\r\nConnection: Upgrade\r\n" + JoinRelayClientHeader + ": " + client + "\r\n\r\n"
	if _, err := io.WriteString(tc, req); err != nil {
		_ = tc.Close()
		return nil, trace.ConnectionProblem(err, "join relay: %v", err)
	}
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		_ = tc.Close()
		return nil, trace.ConnectionProblem(err, "join relay: %v", err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		_ = tc.Close()
		return nil, trace.ConnectionProblem(nil, "the auth API refused the join relay: %s %s", resp.Status, body)
	}
	if br.Buffered() > 0 {
		_ = tc.Close()
		return nil, trace.ConnectionProblem(nil, "join relay: unexpected bytes after the upgrade")
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}
