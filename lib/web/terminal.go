package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
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
// end up in logs and history): it is the first message on the socket.
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
	// Accept refuses (403) an Origin whose host differs from the request's
	// Host: another site's page cannot open a terminal with the user's
	// cookie (cross-site websocket hijacking).
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{TerminalSubprotocol}})
	if err != nil {
		s.cfg.Logger.WithError(err).Debug("Terminal websocket refused.")
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(MaxFrameSize)
	log := s.cfg.Logger.WithField("remote_addr", remoteHost(r.RemoteAddr))
	if c.Subprotocol() != TerminalSubprotocol {
		c.Close(websocket.StatusPolicyViolation, "subprotocol "+TerminalSubprotocol+" required")
		return
	}
	live, err := s.authenticateSocket(c, r)
	if err != nil {
		log.WithError(err).Info("Terminal authentication failed.")
		s.emitTerminalAuthFailed(r, err)
		c.Close(websocket.StatusPolicyViolation, truncateReason(trace.UserMessage(err)))
		return
	}
	log = log.WithField("user", live.user)
	t := &termSession{srv: s, c: c, live: live, log: log, remoteAddr: r.RemoteAddr}
	t.run(r.URL.Query().Get("params"))
}

// authenticateSocket reads the first message and checks it with the
// session cookie of the upgrade request.
func (s *Server) authenticateSocket(c *websocket.Conn, r *http.Request) (*liveSession, error) {
	ctx := s.web.ctx
	// Canceling a read context would drop the socket without a reason, so
	// the timeout closes it properly instead, which ends the read.
	timer := s.cfg.Clock.AfterFunc(authTimeout, func() {
		c.Close(websocket.StatusPolicyViolation, "expected {\"token\":...} as the first message within "+authTimeout.String())
	})
	defer timer.Stop()
	_, msg, err := c.Read(ctx)
	if err != nil {
		return nil, trace.AccessDenied("expected {\"token\":...} as the first message")
	}
	var m authMessage
	if err := strictJSON(msg, &m); err != nil || m.Token == "" {
		return nil, trace.AccessDenied("expected {\"token\":...} as the first message")
	}
	live, err := s.authenticate(ctx, r, m.Token)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if !timer.Stop() {
		return nil, trace.AccessDenied("authentication timed out")
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"status":"ok"}`)); err != nil {
		return nil, trace.Wrap(err)
	}
	return live, nil
}

// termSession is one terminal: it owns the SSH client and the goroutines
// that pump bytes, and returns only when all of them have ended.
type termSession struct {
	srv  *Server
	c    *websocket.Conn
	live *liveSession
	log  logrus.FieldLogger
	// remoteAddr is the browser's address, for the audit trail.
	remoteAddr string
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

// errBrowserGone ends a terminal whose socket broke: nobody to tell.
var errBrowserGone = errors.New("browser disconnected")

func (t *termSession) run(rawParams string) {
	params, err := DecodeTerminalParams(rawParams)
	if err != nil {
		t.fail(err)
		return
	}
	log := t.log.WithFields(logrus.Fields{"target": params.Host, "login": params.Login})
	t.log = log
	ctx, cancel := context.WithCancelCause(t.live.ctx)
	defer cancel(nil)
	expiry := t.srv.cfg.Clock.AfterFunc(t.live.expires.Sub(t.srv.cfg.Clock.Now()), func() { cancel(errSessionExpired) })
	defer expiry.Stop()

	client, sess, stdin, err := t.connect(ctx, params)
	if err != nil {
		t.fail(err)
		return
	}
	defer client.Close()
	kaCfg := t.srv.cfg.WebSessions.NodeKeepAlive
	if kaCfg.Clock == nil {
		kaCfg.Clock = t.srv.cfg.Clock
	}
	// The proxy is the node's SSH client here, so unlike the spliced
	// paths it can probe the node at the SSH level. The client is closed
	// first, which ends a probe in flight.
	ka := utils.StartSSHKeepAlive(client, fmt.Sprintf("node %q", params.Host), kaCfg)
	defer func() {
		client.Close()
		ka.Close()
	}()
	log.Info("Web terminal started.")

	var wg sync.WaitGroup
	// The shell's exit (or the node dropping the connection).
	exited := make(chan *sessionEnd, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := sess.Wait()
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
		cancel(end)
	}()
	// Browser -> node. Reads use the server's context, not ctx: canceling
	// a read context makes the websocket library drop the connection,
	// and the server still has to send the closing frames. Close below
	// unblocks this read.
	wg.Add(1)
	go func() {
		defer wg.Done()
		cancel(t.readLoop(ctx, sess, stdin))
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.keepAlive(ctx, cancel)
	}()

	<-ctx.Done()
	cause := context.Cause(ctx)
	// Closing the client ends the shell's stdout copy and sess.Wait.
	client.Close()
	end := <-exited
	var se *sessionEnd
	switch {
	case errors.As(cause, &se):
		end = se
	case errors.Is(cause, errBrowserGone):
		end = nil
	case cause != nil && !errors.Is(cause, context.Canceled):
		end = &sessionEnd{code: -1, err: cause, reason: truncateReason(cause.Error())}
	}
	if end != nil {
		t.finish(end)
	} else {
		t.c.CloseNow()
	}
	wg.Wait()
	log.Info("Web terminal ended.")
}

// connect routes, checks RBAC for the exact login, dials in-process and
// starts a shell with a pty.
func (t *termSession) connect(ctx context.Context, p *TerminalParams) (*ssh.Client, *ssh.Session, io.WriteCloser, error) {
	cfg := t.srv.cfg.WebSessions
	id, err := t.srv.identity(ctx, t.live)
	if err != nil {
		return nil, nil, nil, trace.Wrap(err)
	}
	target, err := proxy.ParseTarget(p.Host)
	if err != nil {
		return nil, nil, nil, trace.Wrap(err)
	}
	target.Cluster = p.Cluster
	conn, route, err := cfg.Router.DialHost(ctx, proxy.RouteRequest{
		Target: target,
		// The same candidates as on the SSH port and in the node list:
		// nodes the user may reach with any of their logins. The exact
		// login is then checked on the chosen node, and a refusal looks
		// like "not found" too (the log says why).
		Access: id.CanReach,
		Authorize: func(node services.Node) error {
			return id.CheckLogin(&node, p.Login)
		},
	})
	if err != nil {
		t.auditRoute(ctx, p, route, err)
		// As on the SSH port: a denied node looks like a missing one.
		visible, denied := proxy.HideDenied(target, route, err)
		if denied {
			t.log.WithError(err).WithField("hidden", route.Hidden).Warn("Access denied.")
		}
		return nil, nil, nil, trace.Wrap(visible)
	}
	node := route.Node
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	handshakeTimer := t.srv.cfg.Clock.AfterFunc(sshHandshakeTimeout, func() {
		cancel(fmt.Errorf("no SSH handshake within %v", sshHandshakeTimeout))
	})
	defer handshakeTimer.Stop()
	stop := context.AfterFunc(hctx, func() { conn.Close() })
	// The address given to the handshake is the node's UUID, always one
	// of its host certificate's principals.
	_, port, _ := net.SplitHostPort(node.Addr)
	sconn, chans, reqs, err := ssh.NewClientConn(conn, net.JoinHostPort(node.UUID, port), &ssh.ClientConfig{
		User:            p.Login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(t.live.signer)},
		HostKeyCallback: authz.HostKeyCallback(t.live.hostCAs, t.srv.cfg.Clock),
		// AES-GCM first: x/crypto has assembly for it, not for chacha20.
		Config: ssh.Config{Ciphers: []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com", "aes128-ctr"}},
	})
	if !stop() {
		if err == nil {
			sconn.Close()
		}
		return nil, nil, nil, trace.ConnectionProblem(context.Cause(hctx), "SSH connection to node %q failed: %v", node.Hostname, context.Cause(hctx))
	}
	if err != nil {
		conn.Close()
		return nil, nil, nil, trace.ConnectionProblem(err, "SSH connection to node %q as %q failed: %v", node.Hostname, p.Login, err)
	}
	client := ssh.NewClient(sconn, chans, reqs)
	sess, err := client.NewSession()
	if err != nil {
		client.Close()
		return nil, nil, nil, trace.ConnectionProblem(err, "opening a session on node %q: %v", node.Hostname, err)
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		client.Close()
		return nil, nil, nil, trace.Wrap(err)
	}
	out := &frameWriter{t: t}
	sess.Stdout = out
	sess.Stderr = out
	modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 14400, ssh.TTY_OP_OSPEED: 14400}
	if err := sess.RequestPty("xterm-256color", p.Rows, p.Cols, modes); err != nil {
		client.Close()
		return nil, nil, nil, trace.ConnectionProblem(err, "pty request on node %q refused: %v", node.Hostname, err)
	}
	if err := sess.Shell(); err != nil {
		client.Close()
		return nil, nil, nil, trace.ConnectionProblem(err, "shell on node %q refused: %v", node.Hostname, err)
	}
	return client, sess, stdin, nil
}

// readLoop carries browser frames to the session until the browser ends
// it or goes away; it returns the cause.
func (t *termSession) readLoop(ctx context.Context, sess *ssh.Session, stdin io.Writer) error {
	clock := t.srv.cfg.Clock
	lastTouch := clock.Now()
	for {
		typ, msg, err := t.c.Read(t.srv.web.ctx)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if websocket.CloseStatus(err) == websocket.StatusMessageTooBig {
				t.log.Info("Browser sent an oversized frame.")
			}
			return errBrowserGone
		}
		if typ != websocket.MessageBinary {
			continue
		}
		f, err := DecodeFrame(msg)
		if err != nil {
			continue
		}
		switch f.Type {
		case FrameData:
			if _, err := stdin.Write(f.Payload); err != nil {
				return &sessionEnd{code: -1, reason: "connection to the node lost"}
			}
			if now := clock.Now(); now.Sub(lastTouch) >= touchInterval {
				lastTouch = now
				t.srv.touchSession(ctx, t.live.key)
			}
		case FrameResize:
			size, err := DecodeResize(f.Payload)
			if err != nil {
				t.log.WithError(err).Debug("Ignoring a malformed resize.")
				continue
			}
			if err := sess.WindowChange(size.Rows, size.Cols); err != nil {
				t.log.WithError(err).Debug("Window change failed.")
			}
		case FramePing:
			t.write(FramePong, f.Payload)
		case FrameClose:
			return &sessionEnd{code: -1, reason: "closed by the browser"}
		default:
			// Unknown or server-only types (a newer page): ignored.
		}
	}
}

// keepAlive pings the browser; a missed pong ends the terminal.
func (t *termSession) keepAlive(ctx context.Context, cancel context.CancelCauseFunc) {
	interval := t.srv.cfg.WebSessions.KeepAliveInterval
	ticker := t.srv.cfg.Clock.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
			// A ping unanswered for a whole interval drops the socket,
			// which also unblocks a write stuck on a browser that stopped
			// reading.
			timer := t.srv.cfg.Clock.AfterFunc(interval, func() { t.c.CloseNow() })
			// The server's context, not ctx: canceling a ping drops the
			// socket, and a session that just ended still says why.
			err := t.c.Ping(t.srv.web.ctx)
			timer.Stop()
			if err != nil && ctx.Err() == nil {
				t.log.WithError(err).Info("Browser stopped answering pings.")
				cancel(errBrowserGone)
				return
			}
		}
	}
}

// write sends one frame. It is not bounded by a timer of its own: the
// keep-alive drops a socket whose browser stopped answering, which ends a
// stuck write.
func (t *termSession) write(typ byte, payload []byte) error {
	return t.c.Write(t.srv.web.ctx, websocket.MessageBinary, EncodeFrame(typ, payload))
}

// fail reports an error that prevented the session from starting.
func (t *termSession) fail(err error) {
	msg := trace.UserMessage(err)
	t.log.WithError(err).Info("Web terminal failed.")
	t.finish(&sessionEnd{code: -1, err: errors.New(msg), reason: msg})
}

// finish tells the browser how the session ended and closes the socket.
func (t *termSession) finish(end *sessionEnd) {
	if end.err != nil {
		_ = t.write(FrameError, []byte(end.err.Error()))
	}
	data, _ := json.Marshal(CloseMessage{Code: end.code, Reason: end.reason})
	_ = t.write(FrameClose, data)
	code := websocket.StatusNormalClosure
	if end.err != nil {
		code = closeError
	}
	t.c.Close(code, truncateReason(end.reason))
}

// frameWriter turns the shell's output into FrameData messages.
type frameWriter struct {
	t *termSession
}

func (f *frameWriter) Write(p []byte) (int, error) {
	if err := f.t.write(FrameData, p); err != nil {
		return 0, fmt.Errorf("writing to the browser: %w", err)
	}
	return len(p), nil
}
