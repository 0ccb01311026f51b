package srv

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/party"
	"github.com/postern-dev/postern/lib/utils"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("srv: server closed")

// Server is an SSH server (node mode, or proxy mode with Config.Proxy).
type Server struct {
	cfg    Config
	sshCfg *ssh.ServerConfig
	// policy is what this server serves, decided from cfg in New.
	policy *policy
	// ctx is cancelled by Close: it bounds AccessPoint calls made during
	// authentication and is the parent of every conn's context.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards listeners, conns and closing. Lock order: Server.mu before
	// conn.mu.
	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   bool
	// wg counts Serve loops and connection handlers.
	wg sync.WaitGroup
	// locksDone is closed when enforceLocks returns (nil without Locks).
	locksDone chan struct{}
	// trustDone is closed when enforceTrust returns (nil when the
	// AccessPoint announces no trust changes).
	trustDone chan struct{}
	// parties are the node's live pty sessions by id, as others may join
	// them (room.go); nil on the proxy, where nothing runs.
	parties *party.Registry
}

// New creates a server; call Serve to accept connections.
func New(cfg Config) (*Server, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:       cfg,
		policy:    newPolicy(cfg),
		ctx:       ctx,
		cancel:    cancel,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
	}
	if cfg.Proxy == nil {
		s.parties = party.NewRegistry()
	}
	s.sshCfg = &ssh.ServerConfig{
		PublicKeyCallback: s.authenticate,
		ServerVersion:     cfg.ServerVersion,
		// Certificate auth needs one try per offered key; OpenSSH clients
		// offer every key in the agent, so keep OpenSSH's default of 6.
		MaxAuthTries: 6,
	}
	if err := cfg.Algorithms.ServerConfig(s.sshCfg, cfg.HostSigners...); err != nil {
		cancel()
		return nil, trace.Wrap(err)
	}
	if cfg.Locks != nil {
		s.locksDone = make(chan struct{})
		go s.enforceLocks()
	}
	if tw, ok := cfg.AccessPoint.(TrustWatcher); ok {
		s.trustDone = make(chan struct{})
		go s.enforceTrust(tw)
	}
	return s, nil
}

// Serve accepts connections on ln until ln fails or the server is shut
// down; it returns ErrServerClosed in the latter case. Serve may be called
// for several listeners.
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
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()

	return utils.AcceptLoop{
		Listener:  ln,
		What:      "SSH connections",
		Begin:     s.beginConn,
		Handle:    s.handleConn,
		End:       s.wg.Done,
		Closing:   s.isClosing,
		ErrClosed: ErrServerClosed,
	}.Run()
}

// beginConn counts a new connection in Shutdown's wait; false once
// closing.
func (s *Server) beginConn() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// HandleConn serves one connection that came from no listener of this
// server: a client connection carried over a reverse tunnel, which the
// node serves in-process (no TCP hop). It runs the same handshake,
// authentication and session path as an accepted connection, is counted
// in Shutdown's wait and closed by Close, and returns when the connection
// ends. After Shutdown or Close it closes nc at once.
func (s *Server) HandleConn(nc net.Conn) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	s.handleConn(nc)
}

// Shutdown stops accepting, lets open connections finish, and when ctx is
// done first closes them and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closeListeners()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.cancel()
		s.waitLocks()
		return nil
	case <-ctx.Done():
		// Tell first: cancelling the server's context ends the
		// connections derived from it before they could read why.
		s.endConns(MsgShuttingDown)
		s.cancel()
		<-done
		s.waitLocks()
		return trace.Wrap(ctx.Err())
	}
}

// MsgShuttingDown is what an open session reads on stderr when the server
// ends it at the end of its shutdown grace (a proxy draining on SIGTERM):
// without it the user sees only "Broken pipe" and looks for the fault in
// their network. (SSH has a disconnect message for this, but x/crypto
// offers no way to send one; and a session forwarded with `ssh -J` is
// end to end, with no stream of the proxy's to write to.)
const MsgShuttingDown = "postern: this server is shutting down and its grace period is over; connect again to reach another"

// endConns ends every connection, telling its open sessions msg on stderr
// first (bounded like a lock's message: a client that stopped reading
// does not hold the shutdown).
func (s *Server) endConns(msg string) {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		if !c.ending.CompareAndSwap(false, true) {
			c.close("server closing")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.tellAndClose(msg)
		}()
	}
	wg.Wait()
}

// waitLocks waits for enforceLocks and enforceTrust to return after
// s.cancel.
func (s *Server) waitLocks() {
	if s.locksDone != nil {
		<-s.locksDone
	}
	if s.trustDone != nil {
		<-s.trustDone
	}
}

// Close closes listeners and every connection, and waits for them.
func (s *Server) Close() error {
	s.closeListeners()
	s.cancel()
	s.closeConns()
	s.wg.Wait()
	s.waitLocks()
	return nil
}

func (s *Server) closeListeners() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
}

func (s *Server) closeConns() {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.close("server closing")
	}
}

// handleConn runs the handshake and then the connection until it ends.
func (s *Server) handleConn(nc net.Conn) {
	// A connection that came over a tunnel continues the dialing proxy's
	// trace and keeps its connection id (observe.DialMeta); the span of
	// the connection runs from accept to its end, the auth span over the
	// handshake.
	ctx, span := s.cfg.Tracer.Start(observe.MetaOf(nc).Context(s.ctx), "ssh.accept", oteltrace.WithSpanKind(oteltrace.SpanKindServer))
	defer span.End()
	_, authSpan := s.cfg.Tracer.Start(ctx, "ssh.auth")
	// A socket deadline, not the Clock: it must fire even while a
	// callback is blocked, and only the kernel can interrupt a read.
	_ = nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	// No delayed-ACK stall during the handshake (utils.QuickAckConn).
	qc := utils.NewQuickAckConn(nc)
	sconn, chans, reqs, err := ssh.NewServerConn(qc, s.sshCfg)
	qc.Stop()
	observe.End(authSpan, err)
	if err != nil {
		s.cfg.Logger.WithField("remote_addr", nc.RemoteAddr().String()).WithError(err).Debug("SSH handshake failed.")
		_ = nc.Close()
		return
	}
	_ = nc.SetDeadline(time.Time{})
	res, ok := authResultOf(sconn)
	if !ok {
		// Unreachable: authenticate is the only way in and always sets it.
		_ = sconn.Close()
		return
	}
	if s.cfg.Limiter != nil {
		release, err := s.cfg.Limiter.AcquireUser(res.id.User)
		if err != nil {
			s.emitCapRefused(sconn, res, err)
			s.refuseConn(sconn, chans, reqs, err)
			return
		}
		defer release()
	}
	c := newConn(s, nc, sconn, ctx)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("postern.user", res.id.User), attribute.String("postern.login", sconn.User()),
			attribute.String("postern.conn_id", c.id))
	}
	s.mu.Lock()
	if s.closing && s.ctx.Err() != nil {
		s.mu.Unlock()
		_ = sconn.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	// A lock that landed between authentication and the registration
	// above was missed by the sweep: check once more.
	if err := s.checkLocks(res.id); services.IsLocked(err) {
		c.close(lockRefusal(err))
	}
	c.serve(chans, reqs)
}

// refusalWait bounds how long a refused connection is kept open waiting for
// its first channel, the only place SSH can carry a reason the user sees.
const refusalWait = 10 * time.Second

// refuseConn ends an authenticated connection that a cap refused. SSH has no
// message for "authenticated but not admitted", so the reason travels as the
// rejection of the client's first channel (OpenSSH prints "open failed:
// resource shortage: ..."), then the connection closes.
func (s *Server) refuseConn(sconn *ssh.ServerConn, chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request, err error) {
	s.cfg.Logger.WithError(err).WithField("remote_addr", sconn.RemoteAddr().String()).Warn("Connection refused by a cap.")
	// The connection's global requests are refused meanwhile; the loop
	// ends when the connection does, and refuseConn waits for it so that
	// it is counted in s.wg like everything else the connection runs.
	reqsDone := make(chan struct{})
	go func() {
		defer close(reqsDone)
		ssh.DiscardRequests(reqs)
	}()
	defer func() { <-reqsDone }()
	timer := s.cfg.Clock.NewTimer(refusalWait)
	defer timer.Stop()
	select {
	case nch, ok := <-chans:
		if ok {
			_ = nch.Reject(ssh.ResourceShortage, trace.UserMessage(err))
		}
	case <-timer.Chan():
	case <-s.ctx.Done():
	}
	_ = sconn.Close()
	for nch := range chans {
		_ = nch.Reject(ssh.ResourceShortage, trace.UserMessage(err))
	}
}
