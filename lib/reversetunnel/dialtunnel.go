package reversetunnel

// Dialing a tunnel node: the transport channel, and the data connection
// (conn.go has the node's side) that carries the client's bytes beside
// the tunnel rather than inside it.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/limiter"
)

// dataWaiter is a dial waiting for its data connection.
type dataWaiter struct {
	uuid string
	// conn has room for the one connection, so handing it over never
	// blocks.
	conn chan net.Conn
}

// DialTunnel opens a transport channel to node uuid on its newest tunnel,
// falling back to older ones when a channel open fails (a tunnel whose
// keep-alive has not yet noticed it is dead), and waits for the node to
// serve it on a data connection (conn.go) or in the channel. NotFound
// when no tunnel from uuid is here.
func (s *Server) DialTunnel(ctx context.Context, uuid, source, destination string) (net.Conn, error) {
	s.mu.Lock()
	ts := append([]*tunnel(nil), s.byUUID[uuid]...)
	s.mu.Unlock()
	if len(ts) == 0 {
		return nil, trace.NotFound("no tunnel from node %q on this proxy", uuid)
	}
	var last error
	for _, t := range ts {
		if err := ctx.Err(); err != nil {
			return nil, trace.Wrap(err)
		}
		token, w, err := s.offerDataConn(uuid)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		extra, err := json.Marshal(TransportRequest{Source: source, Destination: destination, DataToken: token, Meta: metaOf(ctx)})
		if err != nil {
			s.withdrawDataConn(token, w)
			return nil, trace.Wrap(err)
		}
		ch, reqs, err := t.sconn.OpenChannel(ChannelTransport, extra)
		if err != nil {
			s.withdrawDataConn(token, w)
			last = err
			continue
		}
		conn, err := s.awaitTransport(ctx, t, ch, reqs, token, w)
		if err != nil {
			// An older tunnel may still serve it, unless the caller
			// gave up.
			last = err
			continue
		}
		return conn, nil
	}
	return nil, trace.ConnectionProblem(last, "opening a channel on the tunnel from node %q: %v", uuid, last)
}

// Values of postern_tunnel_transports_total's path label.
const (
	pathDataConn = "data_connection"
	pathInBand   = "in_band"
)

// offerDataConn registers a fresh token for a dial to uuid.
func (s *Server) offerDataConn(uuid string) (string, dataWaiter, error) {
	var b [dataTokenSize]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", dataWaiter{}, trace.Wrap(err)
	}
	token := hex.EncodeToString(b[:])
	w := dataWaiter{uuid: uuid, conn: make(chan net.Conn, 1)}
	s.mu.Lock()
	s.dataWaiters[token] = w
	s.mu.Unlock()
	return token, w, nil
}

// withdrawDataConn ends a dial's offer; a connection that took the token
// meanwhile is closed.
func (s *Server) withdrawDataConn(token string, w dataWaiter) {
	s.mu.Lock()
	_, waiting := s.dataWaiters[token]
	delete(s.dataWaiters, token)
	s.mu.Unlock()
	if !waiting {
		_ = (<-w.conn).Close()
	}
}

// awaitTransport waits until the node serves the transport channel ch:
// on the data connection offered under token, or in the channel
// (RequestInBand). Bounded by HandshakeTimeout and ctx; the channel ends
// on failure.
func (s *Server) awaitTransport(ctx context.Context, t *tunnel, ch ssh.Channel, reqs <-chan *ssh.Request, token string, w dataWaiter) (net.Conn, error) {
	uuid := t.uuid
	timeout := s.cfg.Clock.After(s.cfg.HandshakeTimeout)
	fail := func(err error) (net.Conn, error) {
		s.withdrawDataConn(token, w)
		_ = ch.Close()
		go ssh.DiscardRequests(reqs)
		return nil, err
	}
	for {
		select {
		case nc := <-w.conn:
			// The channel has done its part (conn.go).
			_ = ch.Close()
			go ssh.DiscardRequests(reqs)
			s.transports.WithLabelValues(pathDataConn).Inc()
			return newDataConn(nc, t.done, chanAddr("proxy"), chanAddr("tunnel:"+uuid)), nil
		case req, ok := <-reqs:
			if !ok {
				return fail(trace.ConnectionProblem(nil, "node %q closed the transport channel before serving it", uuid))
			}
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
			if req.Type != RequestInBand {
				continue
			}
			s.withdrawDataConn(token, w)
			go ssh.DiscardRequests(reqs)
			s.transports.WithLabelValues(pathInBand).Inc()
			return newChannelConn(ch, "proxy", "tunnel:"+uuid), nil
		case <-timeout:
			return fail(trace.ConnectionProblem(nil, "node %q did not serve the transport within %v", uuid, s.cfg.HandshakeTimeout))
		case <-ctx.Done():
			return fail(trace.Wrap(ctx.Err()))
		}
	}
}

// handleDataConn takes a node's data connection (its magic already read):
// the token must be one a waiting dial offered, and is then used up.
// Anything else is refused and audited. The deadline set by handleConn
// bounds the token's arrival.
func (s *Server) handleDataConn(nc net.Conn) {
	var b [dataTokenSize]byte
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		s.denyAs(nc.RemoteAddr(), "data connection without a token", "data connection without a token: "+err.Error())
		_ = nc.Close()
		return
	}
	token := hex.EncodeToString(b[:])
	s.mu.Lock()
	w, ok := s.dataWaiters[token]
	delete(s.dataWaiters, token)
	s.mu.Unlock()
	if !ok {
		s.deny(nc.RemoteAddr(), "data connection with a token no dial is waiting for (unknown, used or expired)")
		_ = nc.Close()
		return
	}
	if _, err := nc.Write([]byte{dataConnAck}); err != nil {
		// The dial gets a dead connection and fails at its handshake.
		s.cfg.Logger.WithError(err).WithField("uuid", w.uuid).Debug("Data connection lost at its answer.")
	}
	_ = nc.SetDeadline(time.Time{})
	limiter.HandshakeDone(nc)
	w.conn <- nc
}
