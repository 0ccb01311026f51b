package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/hashicorp/yamux"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/utils"
)

// LocalTunnels is what the Server uses of this proxy's tunnel server
// (*reversetunnel.Server): only tunnels held here, never a Router, so a
// peered dial cannot be peered again.
type LocalTunnels interface {
	HasTunnel(uuid string) bool
	DialTunnel(ctx context.Context, uuid, source, destination string) (net.Conn, error)
}

// DefaultHandshakeTimeout bounds the TLS handshake of a peer connection
// and the first frame of a stream: a peer that sends nothing is dropped.
const DefaultHandshakeTimeout = 10 * time.Second

// ErrServerClosed is returned by Serve after Close or Shutdown.
var ErrServerClosed = errors.New("peer: server closed")

// ServerConfig configures a Server.
type ServerConfig struct {
	Identity
	// Tunnels are this proxy's tunnels. Required.
	Tunnels LocalTunnels
	// HandshakeTimeout: zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// Deps: Audit receives refusals (events.AccessDenied, kind "peer",
	// coalesced by limiter.Denials); Clock checks certificate validity
	// and times the refusals' audit windows (socket timeouts are real
	// time: they bound kernel I/O); Tracer starts peer.serve. Zero fields
	// get observe's defaults.
	observe.Deps
}

// CheckAndSetDefaults validates the config.
func (c *ServerConfig) CheckAndSetDefaults() error {
	if err := c.Identity.check(); err != nil {
		return trace.Wrap(err)
	}
	if c.Tunnels == nil {
		return trace.BadParameter("peer server: missing Tunnels")
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	c.Deps.SetDefaults(observe.ComponentPeerServer)
	return nil
}

// Server serves peered dials on the peer port.
//
// Goroutines: one per accepted connection (its yamux session's accept
// loop) and one per stream, all tracked by wg; Close closes the listeners
// and every session and waits for them.
type Server struct {
	cfg ServerConfig

	// mu guards listeners, sessions, closing.
	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	sessions  map[*yamux.Session]struct{}
	closing   bool
	wg        sync.WaitGroup
	// streams counts open streams, for Shutdown's drain.
	streams sync.WaitGroup
	// denials coalesces the audit events of refusals (deny).
	denials *limiter.Denials
	// ctx is the server's lifetime, the parent of every peered dial's
	// context (cancel: Close).
	ctx    context.Context
	cancel context.CancelFunc
}

// NewServer returns a Server; call Serve.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	s := &Server{cfg: cfg, listeners: map[net.Listener]struct{}{}, sessions: map[*yamux.Session]struct{}{}}
	// The server owns its dials' lifetime: no caller context outlives a
	// stream, so this one is the root, ended by Close.
	s.ctx, s.cancel = context.WithCancel(context.Background())
	var err error
	s.denials, err = limiter.NewDenials(limiter.DenialsConfig{Report: s.auditDenial, Deps: cfg.Deps})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s, nil
}

func yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	// A dead peer is noticed within ~20s (the TCP leg has no keep-alive
	// of its own here): a stream to it fails and the Router retries.
	c.KeepAliveInterval = 10 * time.Second
	// A stream we closed whose far end never closes is reset after this,
	// so a misbehaving peer cannot pin buffers for the 5m default.
	c.StreamCloseTimeout = 30 * time.Second
	// Bulk copies (scp through a peer) want more than the 256 KiB
	// default window on links with latency; 1 MiB per stream is still
	// small next to the SSH channel windows it carries.
	c.MaxStreamWindowSize = 1 << 20
	return c
}

// Serve accepts peer connections on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return trace.ConnectionProblem(err, "accepting peer connections on %v", ln.Addr())
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			_ = nc.Close()
			return ErrServerClosed
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.handleConn(nc)
		}()
	}
}

// deny logs and audits a refusal whose reason is the same each time the
// same peer does the same thing (a refused certificate, a dial to a node
// not here): the reason, with the peer and the node, is its kind for
// limiter.Denials.
func (s *Server) deny(remote, peerID, reason string, extra events.Fields) {
	kind := reason
	if target, ok := extra[events.FieldTarget].(string); ok {
		kind += "\x00" + target
	}
	s.denyAs(remote, peerID, kind, reason, extra)
}

// denyAs is deny for a reason that differs between connections of one
// attack (a handshake error names the connection's addresses): kind is
// what stays the same. The peer and extra fields audited with a summary
// are those of its first refusal (the kind holds what differs).
func (s *Server) denyAs(remote, peerID, kind, reason string, extra events.Fields) {
	s.cfg.Logger.WithFields(logrus.Fields{"remote_addr": remote, "peer": peerID, "reason": reason}).Debug("Peer refused.")
	f := events.Fields{}
	if peerID != "" {
		f[events.FieldServerID] = peerID
		kind += "\x00" + peerID
	}
	for k, v := range extra {
		f[k] = v
	}
	s.denials.DenyWith(remote, kind, reason, f)
}

// auditDenial writes what limiter.Denials reports, and logs it as a
// warning: a flood costs a bounded number of lines too (each refusal is
// logged at debug level).
func (s *Server) auditDenial(d limiter.Denial) {
	s.cfg.Logger.WithFields(logrus.Fields{"remote_addr": d.Addr, "reason": d.Text(), "count": d.Count}).Warn("Peer refused.")
	f := events.Fields{}
	for k, v := range d.Fields {
		f[k] = v
	}
	f[events.FieldKind], f[events.FieldRemoteAddr], f[events.FieldReason], f[events.FieldCount] = "peer", d.Addr, d.Text(), d.Count
	// limiter.Denials reports from its own timer, after the refused
	// stream is gone, and flushes at Close: the server's context, without
	// its cancel, is all there is.
	s.cfg.Audit.Emit(context.WithoutCancel(s.ctx), events.Event{Type: events.AccessDenied, Fields: f})
}

func (s *Server) tlsConfig(remote string, refused *bool) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{s.cfg.Certificate},
		// The chain is checked by verifyPeer (role, cluster, UUID), not
		// by crypto/tls's client verification, which knows none of them.
		ClientAuth: tls.RequireAnyClientCert,
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{ALPNv2},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if _, err := verifyPeer(cs, s.cfg.CAPool(), s.cfg.ClusterName, "", s.cfg.Clock.Now()); err != nil {
				*refused = true
				s.deny(remote, peerCN(cs), trace.UserMessage(err), nil)
				return err
			}
			return nil
		},
	}
}

func peerCN(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return cs.PeerCertificates[0].Subject.CommonName
}

func (s *Server) handleConn(nc net.Conn) {
	remote := nc.RemoteAddr().String()
	var refused bool
	tc := tls.Server(nc, s.tlsConfig(remote, &refused))
	_ = nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	if err := tc.Handshake(); err != nil {
		if !refused {
			s.denyAs(remote, "", "peer TLS handshake failed", "peer TLS handshake failed: "+err.Error(), nil)
		}
		_ = nc.Close()
		return
	}
	_ = nc.SetDeadline(time.Time{})
	limiter.HandshakeDone(nc)
	peerID := peerCN(tc.ConnectionState())
	sess, err := yamux.Server(&coalescingConn{Conn: tc}, yamuxConfig())
	if err != nil {
		_ = tc.Close()
		return
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = sess.Close()
		return
	}
	s.sessions[sess] = struct{}{}
	s.mu.Unlock()
	log := s.cfg.Logger.WithFields(logrus.Fields{"peer": peerID, "remote_addr": remote})
	log.Debug("Peer connected.")
	defer func() {
		s.mu.Lock()
		delete(s.sessions, sess)
		s.mu.Unlock()
		_ = sess.Close()
		log.Debug("Peer disconnected.")
	}()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closing {
			// Draining: no new dial here, the open ones go on.
			s.mu.Unlock()
			_ = st.Close()
			continue
		}
		s.wg.Add(1)
		s.streams.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer s.streams.Done()
			s.handleStream(st, peerID, remote)
		}()
	}
}

// handleStream serves one peered dial: the request, then the splice.
func (s *Server) handleStream(st *yamux.Stream, peerID, remote string) {
	c := newStreamConn(st)
	defer c.Close()
	_ = st.SetReadDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	req, err := ParseDialRequest(st)
	if err != nil {
		s.deny(remote, peerID, trace.UserMessage(err), nil)
		_ = writeFrame(st, responseFor(err))
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	fields := events.Fields{events.FieldTarget: req.NodeUUID}
	// Fail fast, and never route further: a node whose tunnel is not here
	// is a stale lease at the caller, not something to look for.
	if !s.cfg.Tunnels.HasTunnel(req.NodeUUID) {
		err := trace.NotFound("proxy %q holds no tunnel from node %q", s.cfg.UUID, req.NodeUUID)
		s.deny(remote, peerID, trace.UserMessage(err), fields)
		_ = writeFrame(st, responseFor(err))
		return
	}
	// The dial's context is the caller's trace and connection id on
	// the server's lifetime: the stream is the request, and the server's
	// Close ends it.
	meta, merr := req.meta()
	if merr != nil {
		s.cfg.Logger.WithError(merr).WithField("peer", peerID).Warn("Ignoring malformed dial metadata from a peer.")
	}
	ctx := meta.Context(s.ctx)
	ctx, span := s.cfg.Tracer.Start(ctx, "peer.serve", oteltrace.WithSpanKind(oteltrace.SpanKindServer),
		oteltrace.WithAttributes(attribute.String("postern.node_uuid", req.NodeUUID), attribute.String("postern.peer", peerID)))
	defer span.End()
	dctx, cancel := context.WithTimeout(ctx, s.cfg.HandshakeTimeout)
	nc, err := s.cfg.Tunnels.DialTunnel(dctx, req.NodeUUID, req.Source, req.Destination)
	cancel()
	if err != nil {
		span.SetStatus(codes.Error, trace.UserMessage(err))
		s.cfg.Logger.WithError(err).WithFields(observe.LogFields(ctx)).WithFields(logrus.Fields{"peer": peerID, "node": req.NodeUUID}).Warn("Peered dial over a local tunnel failed.")
		_ = writeFrame(st, responseFor(trace.Wrap(err)))
		return
	}
	defer nc.Close()
	if err := writeFrame(st, DialResponse{}); err != nil {
		return
	}
	s.cfg.Logger.WithFields(logrus.Fields{"peer": peerID, "node": req.NodeUUID, "source": req.Source}).Debug("Peered dial.")
	// The stream's own end (Close) ends the splice; a session torn down
	// by Close resets every stream.
	_, _, _ = utils.Splice(ctx, c, nc)
}

// Close closes the listeners and every peer connection (and so every
// stream on them) and waits for their goroutines.
func (s *Server) Close() error {
	s.cancel()
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	sessions := make([]*yamux.Session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	for _, sess := range sessions {
		_ = sess.Close()
	}
	s.wg.Wait()
	// After the last handler: no refusal is left to count.
	s.denials.Close()
	return nil
}

// StopAccepting closes the listeners and tells every peer to open no new
// stream here (yamux go-away: their next dial goes to another proxy or
// waits for one), leaving the open dials running. It is the first half
// of Shutdown, run early in a proxy's shutdown so that peers stop
// sending work here while sessions drain.
func (s *Server) StopAccepting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	for sess := range s.sessions {
		_ = sess.GoAway()
	}
}

// Shutdown stops accepting connections and streams, waits for the open
// streams to end or ctx to expire, then closes everything.
func (s *Server) Shutdown(ctx context.Context) error {
	s.StopAccepting()
	drained := make(chan struct{})
	go func() {
		s.streams.Wait()
		close(drained)
	}()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = trace.ConnectionProblem(ctx.Err(), "peer streams still open at shutdown")
	}
	_ = s.Close()
	<-drained
	return err
}
