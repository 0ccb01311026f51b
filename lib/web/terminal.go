package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	oteltrace "go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/sessionapi"
	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/utils"
)

// Timeouts of the terminal websocket.
const (
	// authTimeout bounds the wait for the first message: a socket that
	// never authenticates must not hold a goroutine.
	authTimeout = 10 * time.Second
	// sshHandshakeTimeout bounds the SSH handshake with the node.
	sshHandshakeTimeout = 30 * time.Second
	// DefaultKeepAliveInterval is how often the server pings the browser:
	// a browser that vanished without closing its TCP connection (laptop
	// lid, lost Wi-Fi) is noticed within two intervals and its SSH
	// session ends.
	DefaultKeepAliveInterval = 30 * time.Second
)

// Timers here are clock.AfterFunc rather than clockwork.WithTimeout: the
// fake clock's context blocks in Err() until it is done and drops the
// cancel cause, and causes are what the browser is told.

// errSessionExpired ends a terminal at the web session's absolute expiry.
var errSessionExpired = errors.New("the web session expired; log in again")

// Websocket close codes of the terminal (RFC 6455 section 7.4; 4000-4999
// are for applications).
const (
	// closeError: the session could not start or failed; the reason (and,
	// in full, the preceding FrameError) says why.
	closeError websocket.StatusCode = 4000
)

// maxCloseReason is RFC 6455's 123-byte limit on a close reason.
const maxCloseReason = 123

func truncateReason(s string) string {
	if len(s) <= maxCloseReason {
		return s
	}
	s = s[:maxCloseReason-3]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// terminal serves GET /webapi/terminal. The token is not in the URL (URLs
// end up in logs and history): it is the first message on the socket,
// with the resume token when the page reattaches to a detached terminal.
func (s *Server) terminal(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.WebSessions.enabled() {
		writeError(w, http.StatusNotImplemented, "web sessions are not available on this proxy")
		return
	}
	if !s.web.track() {
		writeError(w, http.StatusServiceUnavailable, "the proxy is shutting down")
		return
	}
	defer s.web.terminals.Done()
	c, live, msg, log, ok := s.acceptTermSocket(w, r)
	if !ok {
		return
	}
	defer c.CloseNow()
	sock := &termSocket{srv: s, c: c, live: live, log: log, remoteAddr: r.RemoteAddr, sequenced: msg.Ack != nil, mfaToken: msg.MFAToken}
	if msg.Resume != "" {
		t, err := s.web.terms.claim(live, msg.Resume)
		if err != nil {
			log.WithError(err).Warn("Terminal resume refused.")
			s.emitResumeRefused(r, live, err)
			c.Close(websocket.StatusPolicyViolation, truncateReason(trace.UserMessage(err)))
			return
		}
		if err := writeOK(s.web.ctx, c); err != nil {
			// The token was used: the terminal stays detached until its
			// grace period ends, like a resume that never came.
			return
		}
		sock.log = t.log
		t.log.Info("Web terminal resumed.")
		sock.serve(t, *msg.Ack)
		return
	}
	if err := writeOK(s.web.ctx, c); err != nil {
		return
	}
	t, err := s.startTerm(r.Context(), live, r.URL.Query().Get("params"), sock)
	if err != nil {
		sock.fail(err)
		return
	}
	sock.log = t.log
	sock.serve(t, 0)
}

func writeOK(ctx context.Context, c *websocket.Conn) error {
	return trace.Wrap(c.Write(ctx, websocket.MessageText, []byte(`{"status":"ok"}`)))
}

// authenticateSocket reads the first message and checks it with the
// session cookie of the upgrade request.
func (s *Server) authenticateSocket(c *websocket.Conn, r *http.Request) (*liveSession, *webterm.AuthMessage, error) {
	ctx := s.web.ctx
	// Canceling a read context would drop the socket without a reason, so
	// the timeout closes it properly instead, which ends the read.
	timer := s.cfg.Clock.AfterFunc(authTimeout, func() {
		c.Close(websocket.StatusPolicyViolation, "expected {\"token\":...} as the first message within "+authTimeout.String())
	})
	defer timer.Stop()
	_, data, err := c.Read(ctx)
	if err != nil {
		return nil, nil, trace.AccessDenied("expected {\"token\":...} as the first message")
	}
	msg, err := webterm.DecodeAuthMessage(data)
	if err != nil {
		return nil, nil, trace.AccessDenied("expected {\"token\":...} as the first message")
	}
	live, err := s.authenticate(ctx, r, msg.Token)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	if !timer.Stop() {
		return nil, nil, trace.AccessDenied("authentication timed out")
	}
	return live, msg, nil
}

// sessionEnd is the cause that ends a terminal, with what the browser is
// told.
type sessionEnd struct {
	// code is the remote exit status, or -1.
	code int
	// err is shown to the user; nil for a normal end.
	err error
	// reason is the close reason.
	reason string
}

func (e *sessionEnd) Error() string { return e.reason }

// errBrowserGone ends a socket that broke: nobody to tell. It ends the
// terminal too unless the terminal is resumable.
var errBrowserGone = errors.New("browser disconnected")

// errGraceExpired ends a detached terminal nobody resumed.
var errGraceExpired = errors.New("detached and not resumed within the grace period")

// startTerm connects a new terminal and starts its goroutine. reqCtx is
// the upgrade request's context: the route and dial spans join its trace.
// It does not bound the terminal, which lives on the web session's
// context (a resumable terminal outlives its request).
func (s *Server) startTerm(reqCtx context.Context, live *liveSession, rawParams string, sock *termSocket) (*term, error) {
	params, err := DecodeTerminalParams(rawParams)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.launchTerm(reqCtx, live, params, sock, "", sock.connect)
}

// termConnect opens a terminal's SSH session on its node: a shell of
// its own (termSocket.connect) or a joined session (connectJoin).
type termConnect func(ctx context.Context, p *TerminalParams, out *term) (*ssh.Client, *ssh.Session, io.WriteCloser, error)

// launchTerm makes a terminal, connects it and starts its goroutine.
// joinMode is empty for a shell of the user's own, else the mode in
// which the terminal joined someone else's session.
func (s *Server) launchTerm(reqCtx context.Context, live *liveSession, params *TerminalParams, sock *termSocket, joinMode sessionapi.Mode, connect termConnect) (*term, error) {
	id, err := randomHex()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	id = id[:16]
	clock := s.cfg.Clock
	t := &term{
		srv: s, id: id, live: live, params: params, started: clock.Now(), remoteAddr: sock.remoteAddr,
		// A joined session is not resumed: rejoining shows its screen.
		resumable: sock.sequenced && s.cfg.WebSessions.TerminalGrace > 0 && joinMode == "",
		joinMode:  joinMode,
		log:       sock.log.WithFields(logrus.Fields{"target": params.Host, "login": params.Login, "terminal_id": id}),
		done:      make(chan struct{}),
		hist:      newHistory(params.Cols, params.Rows, replayBufferSize),
	}
	t.ctx, t.cancel = context.WithCancelCause(live.ctx)
	// The web session's absolute expiry ends its terminals, detached or not.
	expiry := clock.AfterFunc(live.expires.Sub(clock.Now()), func() { t.cancel(errSessionExpired) })
	sock.term = t
	// The dial carries the upgrade request's span (its trace) but the
	// terminal's lifetime: a resumable terminal outlives its request.
	dctx := oteltrace.ContextWithSpan(t.ctx, oteltrace.SpanFromContext(reqCtx))
	client, sess, stdin, err := connect(dctx, params, t)
	if err != nil {
		expiry.Stop()
		t.cancel(nil)
		t.hist.close()
		return nil, trace.Wrap(err)
	}
	t.client, t.sess, t.stdin = client, sess, stdin
	if t.wait == nil {
		t.wait = sess.Wait
	}
	if !s.web.track() {
		expiry.Stop()
		client.Close()
		t.abortRecording()
		t.cancel(nil)
		t.hist.close()
		return nil, trace.ConnectionProblem(nil, "the proxy is shutting down")
	}
	if !s.web.terms.add(t) {
		s.web.terminals.Done()
		expiry.Stop()
		client.Close()
		t.abortRecording()
		t.cancel(nil)
		t.hist.close()
		return nil, trace.ConnectionProblem(nil, "the proxy is shutting down")
	}
	go func() {
		defer s.web.terminals.Done()
		defer expiry.Stop()
		t.run()
	}()
	t.log.WithField("resumable", t.resumable).Info("Web terminal started.")
	return t, nil
}

// term is one web terminal: the SSH session on the node, its output
// history and screen, and the socket attached to it (none while
// detached). It outlives its sockets by up to the grace period.
type term struct {
	srv     *Server
	id      string
	live    *liveSession
	params  *TerminalParams
	started time.Time
	// The node as routed (set by connect, then read-only).
	nodeHostname, nodeUUID, cluster string
	// openSSHNode is the UUID of the OpenSSH node the terminal reached,
	// set once connected (nil otherwise): the lock sweep, which runs
	// beside connect, reads it to end the terminals a node lock covers.
	openSSHNode atomic.Pointer[string]
	remoteAddr  string
	// resumable: the client speaks the sequenced dialect and the grace
	// period is on; otherwise the terminal ends with its socket.
	resumable bool
	log       logrus.FieldLogger
	ctx       context.Context
	cancel    context.CancelCauseFunc
	// done is closed when run returned; end is set before.
	done   chan struct{}
	client *ssh.Client
	sess   *ssh.Session
	stdin  io.WriteCloser
	// wait returns when the remote side ended: sess.Wait, or for a
	// joined session (a subsystem, which x/crypto's Wait does not
	// follow) the end of its output (set by connect, then read-only).
	wait func() error

	// tokenHash is the hash of the resume token issued last; prevHash
	// that of the token the attached socket resumed with, which stays
	// valid until the client confirms it holds the new one
	// (termRegistry.confirm). Both guarded by the registry's mu.
	tokenHash string
	prevHash  string

	// Lock order: outMu, then inMu, then mu. outMu serializes output
	// (and the switch of sockets, so that a replay and live output never
	// interleave); inMu serializes input with the same switch, so a
	// replaced socket's late keystroke cannot slip in after the new
	// socket was told the input count.
	outMu sync.Mutex
	inMu  sync.Mutex
	// hist is the output's replay buffer and emulator (its own lock;
	// writes, screens and close are serialized by outMu).
	hist *history
	// mu guards the fields below.
	mu    sync.Mutex
	att   *termSocket
	grace clockwork.Timer
	input uint64
	end   *sessionEnd
	// attached: a socket was attached before, so the next attach is a
	// resume and its replay is marked (webterm.Session.Replay).
	attached bool
	// joinMode is the mode of a terminal that joined another user's
	// session (sessions_join.go), empty for a shell of its own.
	joinMode sessionapi.Mode
	// rec is the proxy's recording of a terminal to an OpenSSH node (set
	// by connect, then read-only; the writer has its own lock).
	rec termRecording
}

// Write takes the shell's output (stdout and stderr): into the history
// and the emulator, then to the attached socket. It never fails: a socket
// that cannot take the bytes is dropped and the bytes wait in the buffer.
func (t *term) Write(p []byte) (int, error) {
	t.outMu.Lock()
	defer t.outMu.Unlock()
	if !t.recordOutput(p) {
		// A required recording failed: what it did not take is not
		// shown (the terminal is ending).
		return len(p), nil
	}
	seq := t.hist.write(p)
	t.mu.Lock()
	a := t.att
	t.mu.Unlock()
	if a != nil {
		if err := a.writeData(seq, p); err != nil {
			a.c.CloseNow()
		}
	}
	return len(p), nil
}

// run waits for the terminal's end, then closes the SSH session, tells
// the attached socket and records session.end.
func (t *term) run() {
	defer close(t.done)
	defer t.srv.web.terms.remove(t)
	defer func() {
		// outMu: an attach that began before the end computes its screen
		// first; later ones see t.end.
		t.outMu.Lock()
		t.hist.close()
		t.outMu.Unlock()
	}()
	kaCfg := t.srv.cfg.WebSessions.NodeKeepAlive
	if kaCfg.Clock == nil {
		kaCfg.Clock = t.srv.cfg.Clock
	}
	// The proxy is the node's SSH client here, so unlike the spliced
	// paths it can probe the node at the SSH level. The client is closed
	// first, which ends a probe in flight.
	ka := utils.StartSSHKeepAlive(t.client, fmt.Sprintf("node %q", t.params.Host), kaCfg)
	defer ka.Close()
	defer t.client.Close()
	// The shell's exit (or the node dropping the connection).
	exited := make(chan *sessionEnd, 1)
	go func() {
		err := t.wait()
		end := &sessionEnd{code: -1, reason: "session ended"}
		var exitErr *ssh.ExitError
		switch {
		case err == nil:
			end.code = 0
		case errors.As(err, &exitErr):
			end.code = exitErr.ExitStatus()
		case ka.Err() != nil:
			end.err = ka.Err()
			end.reason = truncateReason(ka.Err().Error())
		default:
			end.reason = "connection to the node lost"
		}
		exited <- end
		t.cancel(end)
	}()
	<-t.ctx.Done()
	cause := context.Cause(t.ctx)
	var end *sessionEnd
	if errors.Is(cause, errGraceExpired) {
		// As a terminal whose line dropped: the shell gets SIGHUP (and may
		// save its history), then the session closes.
		if err := t.sess.Signal(ssh.SIGHUP); err != nil {
			t.log.WithError(err).Debug("SIGHUP not delivered.")
		}
		timer := t.srv.cfg.Clock.NewTimer(hangupWait)
		select {
		case end = <-exited:
		case <-timer.Chan():
		}
		timer.Stop()
	}
	// Closing the client ends the shell's output copy and sess.Wait.
	t.client.Close()
	if end == nil {
		end = <-exited
	}
	var se *sessionEnd
	switch {
	case errors.As(cause, &se):
		end = se
	case errors.Is(cause, errBrowserGone):
		end = &sessionEnd{code: -1, reason: "browser disconnected"}
	case cause != nil && !errors.Is(cause, context.Canceled):
		end = &sessionEnd{code: -1, err: cause, reason: truncateReason(cause.Error())}
	}
	t.mu.Lock()
	t.end = end
	if t.grace != nil {
		t.grace.Stop()
	}
	t.mu.Unlock()
	if t.joinMode == "" {
		// The node audits a joiner's leave (session.leave); the
		// session's end is its owner's.
		t.emitEnd(end)
	}
	t.log.WithField("reason", end.reason).Info("Web terminal ended.")
}

// hangupWait is how long a hung-up shell may take to exit before its
// session is closed anyway.
const hangupWait = 2 * time.Second

// attach makes sock the terminal's socket: the previous one (a reload
// the server has not noticed yet) is dropped, the grace timer stops, a
// new resume token is issued and what the client has not rendered is
// replayed, or the screen repainted.
func (t *term) attach(sock *termSocket, ack uint64) error {
	t.outMu.Lock()
	defer t.outMu.Unlock()
	t.inMu.Lock()
	t.mu.Lock()
	if t.end != nil || t.ctx.Err() != nil {
		t.mu.Unlock()
		t.inMu.Unlock()
		return trace.NotFound("the terminal ended")
	}
	old := t.att
	t.att = sock
	resumed := t.attached
	t.attached = true
	if t.grace != nil {
		t.grace.Stop()
		t.grace = nil
	}
	info := webterm.Session{ID: t.id, Input: t.input, GraceSeconds: int64(t.srv.cfg.WebSessions.TerminalGrace / time.Second)}
	t.mu.Unlock()
	t.inMu.Unlock()
	if old != nil {
		old.c.CloseNow()
	}
	// Still under outMu: no output moves while the client catches up.
	replay, start, exact := t.hist.since(ack)
	var repaint []byte
	lost := uint64(0)
	if resumed {
		info.Replay = t.hist.end()
	}
	if exact {
		info.Seq = ack
	} else if sock.sequenced {
		var st screenState
		st, info.Seq = t.hist.screen()
		repaint = st.repaint
		if ack < start {
			lost = start - ack
		}
	}
	if sock.sequenced {
		if t.resumable {
			token, err := t.srv.web.terms.rotate(t)
			if err != nil {
				return trace.Wrap(err)
			}
			info.Resume = token
		}
		data, err := json.Marshal(info)
		if err != nil {
			return trace.Wrap(err)
		}
		if err := sock.write(webterm.FrameSession, data); err != nil {
			return trace.Wrap(err)
		}
	}
	// A new terminal's socket gets what the shell printed before it was
	// attached (the prompt) the same way.
	if exact || !sock.sequenced {
		for off := 0; off < len(replay); off += replayChunk {
			chunk := replay[off:min(off+replayChunk, len(replay))]
			if err := sock.writeData(ack+uint64(off), chunk); err != nil {
				return trace.Wrap(err)
			}
		}
		return nil
	}
	if err := sock.c.Write(t.srv.web.ctx, websocket.MessageBinary, webterm.EncodeSeqFrame(webterm.FrameRepaint, info.Seq, repaint)); err != nil {
		return trace.Wrap(err)
	}
	notice := "Screen restored: more output arrived while disconnected than the proxy keeps."
	if lost > 0 {
		notice = fmt.Sprintf("Screen restored: %s of output scrolled away while disconnected.", formatBytes(lost))
	}
	return trace.Wrap(sock.write(webterm.FrameNotice, []byte(notice)))
}

// replayChunk keeps replayed frames well under MaxFrameSize-sized reads.
const replayChunk = 32 << 10

func formatBytes(n uint64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// detach is called when sock went away without ending the terminal: a
// resumable terminal waits for a resume for the grace period, any other
// ends.
func (t *term) detach(sock *termSocket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.att != sock {
		return // replaced by a resume
	}
	t.att = nil
	if !t.resumable {
		t.cancel(errBrowserGone)
		return
	}
	if t.srv.web.terms.isDraining() {
		// This proxy no longer accepts the resume.
		t.cancel(errShuttingDown)
		return
	}
	grace := t.srv.cfg.WebSessions.TerminalGrace
	t.grace = t.srv.cfg.Clock.AfterFunc(grace, func() { t.cancel(errGraceExpired) })
	t.log.WithField("grace", grace).Info("Web terminal detached; waiting for a resume.")
}

// confirmToken retires the token sock resumed with, if sock is still the
// attached socket: its client read the FrameSession with the next one.
// Under t.mu, so that a resume racing it keeps its own fallback.
func (t *term) confirmToken(sock *termSocket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.att == sock {
		t.srv.web.terms.confirm(t)
	}
}

// input passes one browser keystroke frame to the shell, if sock is
// still the attached socket (a replaced socket's frames are dropped: the
// new socket's client resends from the count it was given).
func (t *term) writeInput(sock *termSocket, p []byte) error {
	t.inMu.Lock()
	defer t.inMu.Unlock()
	t.mu.Lock()
	attached := t.att == sock
	t.mu.Unlock()
	if !attached || t.joinMode == sessionapi.Observer {
		// An observer's keystrokes are never sent (the node would drop
		// them too, and tell the observer so in the output).
		return nil
	}
	if _, err := t.stdin.Write(p); err != nil {
		return err
	}
	t.recordInput(p)
	t.mu.Lock()
	t.input += uint64(len(p))
	t.mu.Unlock()
	return nil
}

func (t *term) resize(sock *termSocket, size TermSize) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.att != sock {
		return nil
	}
	t.hist.resize(size.Cols, size.Rows)
	if t.joinMode != "" {
		// The window is the owner's: a joiner's browser size only
		// changes how the proxy's copy of the screen wraps.
		return nil
	}
	t.recordResize(uint32(size.Cols), uint32(size.Rows))
	return t.sess.WindowChange(size.Rows, size.Cols)
}
