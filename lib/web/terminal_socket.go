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

	"github.com/coder/websocket"
	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
)

// termSocket is one websocket attached to a terminal: it owns the
// goroutines that read the browser's frames and ping it, and returns
// only when both have ended.
type termSocket struct {
	srv  *Server
	c    *websocket.Conn
	live *liveSession
	log  logrus.FieldLogger
	// remoteAddr is the browser's address, for the audit trail.
	remoteAddr string
	// sequenced: the client speaks the resumable dialect.
	sequenced bool
	// term is set once the terminal exists (for the audit of a refused
	// route, before it does, it carries the params).
	term *term
	// mfaToken is the first message's per-session MFA token (a new
	// terminal to a node that needs one; sessionmfa.go).
	mfaToken string
}

// acceptTermSocket upgrades a terminal websocket (the terminal's and a
// joined session's) and authenticates its first message; false when it
// failed, the socket then closed with the reason.
func (s *Server) acceptTermSocket(w http.ResponseWriter, r *http.Request) (*websocket.Conn, *liveSession, *webterm.AuthMessage, logrus.FieldLogger, bool) {
	// Accept refuses (403) an Origin whose host differs from the request's
	// Host: another site's page cannot open a terminal with the user's
	// cookie (cross-site websocket hijacking).
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{TerminalSubprotocol}})
	if err != nil {
		s.cfg.Logger.WithError(err).Debug("Terminal websocket refused.")
		return nil, nil, nil, nil, false
	}
	c.SetReadLimit(MaxFrameSize)
	log := s.cfg.Logger.WithField("remote_addr", remoteHost(r.RemoteAddr))
	if c.Subprotocol() != TerminalSubprotocol {
		c.Close(websocket.StatusPolicyViolation, "subprotocol "+TerminalSubprotocol+" required")
		return nil, nil, nil, nil, false
	}
	live, msg, err := s.authenticateSocket(c, r)
	if err != nil {
		log.WithError(err).Info("Terminal authentication failed.")
		s.emitTerminalAuthFailed(r, err)
		c.Close(websocket.StatusPolicyViolation, truncateReason(trace.UserMessage(err)))
		return nil, nil, nil, nil, false
	}
	return c, live, msg, log.WithField("user", live.user), true
}

// serve attaches the socket and carries frames until the socket or the
// terminal ends.
func (s *termSocket) serve(t *term, ack uint64) {
	// Drop the previous socket first: a write stuck on it holds outMu,
	// which attach needs.
	t.mu.Lock()
	old := t.att
	t.mu.Unlock()
	if old != nil {
		old.c.CloseNow()
	}
	if err := t.attach(s, ack); err != nil {
		if trace.IsNotFound(err) {
			s.fail(err)
			return
		}
		s.log.WithError(err).Info("Attaching the terminal failed.")
		t.detach(s)
		return
	}
	ctx, cancel := context.WithCancelCause(t.ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(2)
	// Browser -> node. Reads use the server's context, not ctx: canceling
	// a read context makes the websocket library drop the connection,
	// and the server still has to send the closing frames. Closing the
	// socket unblocks this read.
	go func() {
		defer wg.Done()
		cancel(s.readLoop(ctx, t))
	}()
	go func() {
		defer wg.Done()
		s.keepAlive(ctx, cancel)
	}()
	<-ctx.Done()
	cause := context.Cause(ctx)
	var se *sessionEnd
	switch {
	case t.ctx.Err() != nil:
		// The terminal ended: say why.
		<-t.done
		t.mu.Lock()
		end := t.end
		t.mu.Unlock()
		s.finish(end)
	case errors.As(cause, &se):
		// The browser asked to end the terminal.
		t.cancel(se)
		<-t.done
		s.finish(se)
	default:
		s.c.CloseNow()
		t.detach(s)
	}
	wg.Wait()
}

// connect routes, checks RBAC for the exact login, dials in-process and
// starts a shell with a pty.
func (t *termSocket) connect(ctx context.Context, p *TerminalParams, out *term) (*ssh.Client, *ssh.Session, io.WriteCloser, error) {
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
		// A tunnel node records the browser's address.
		Source: t.remoteAddr,
		// The same candidates as on the SSH port and in the node list:
		// nodes the user may reach with any of their logins. The exact
		// login is then checked on the chosen node, and a refusal looks
		// like "not found" too (the log says why).
		Access: id.CanReach,
		Authorize: func(node services.Node) error {
			return id.CheckLogin(&node, p.Login)
		},
		// A leaf cluster decides from the session's certificate (its
		// node then checks the login).
		Cert: t.live.cert,
	})
	if err != nil {
		t.auditRoute(ctx, target, p, route, err)
		// As on the SSH port: a denied node looks like a missing one.
		visible, denied := proxy.HideDenied(target, route, err)
		if denied {
			t.log.WithError(err).WithField("hidden", route.Hidden).Warn("Access denied.")
		}
		return nil, nil, nil, trace.Wrap(visible)
	}
	if route.Leaf {
		t.auditRoute(ctx, target, p, route, nil)
	}
	node := route.Node
	out.nodeHostname, out.nodeUUID, out.cluster = node.Hostname, node.UUID, route.Cluster
	signer := t.live.signer
	if !route.Leaf {
		if err := id.CheckSessionMFA(&node, t.srv.cfg.ClusterName); err != nil {
			grant := t.live.grants.take(t.mfaToken, node.UUID, p.Login, t.srv.cfg.Clock.Now())
			if grant == nil {
				conn.Close()
				t.log.WithError(err).Info("Refused a terminal without its fresh second factor.")
				return nil, nil, nil, trace.AccessDenied(msgTerminalNeedsMFA)
			}
			signer = grant.signer
		}
	}
	// The address given to the handshake is the node's UUID, always one
	// of its host certificate's principals, checked against this
	// cluster's host CA: the login's host CAs are scoped (a leaf's
	// vouches only for *.LEAF names, never for a local node's UUID). An
	// OpenSSH node's certificate (pctl nodes add-openssh) names NAME,
	// NAME.CLUSTER and its address's host, not the UUID: its hostname.
	_, port, _ := net.SplitHostPort(node.Addr)
	hostName := node.UUID
	if node.IsOpenSSH() {
		hostName = node.Hostname
	}
	hostAddr, hostKeys := net.JoinHostPort(hostName, port), authz.ScopedHostKeyCallback(t.live.hostCAs, t.srv.cfg.Clock)
	if route.Leaf {
		// The leaf's Router chose the node: the root knows only what the
		// user asked for, and a leaf node's certificate is checked
		// against that leaf's host CA alone, for NAME.LEAF (a leaf's CA
		// vouches for its own names only).
		out.nodeHostname, out.nodeUUID = route.Target.Host, route.Target.Host
		if hostKeys, err = t.leafHostKeys(ctx, route); err != nil {
			conn.Close()
			return nil, nil, nil, trace.Wrap(err)
		}
		hostAddr = route.Target.Host + "." + route.Cluster
		node.Hostname = hostAddr
	}
	if lo := route.LeafOpenSSH; route.Leaf && lo != nil {
		// A leaf's OpenSSH node trusts the leaf's user CA only: the leaf
		// signed this key for the logins its roles allow the user there
		// (lib/auth/opensshroot.go).
		if signer, err = leafOpenSSHSigner(t.live.keySigner, lo, hostAddr); err != nil {
			conn.Close()
			return nil, nil, nil, trace.Wrap(err)
		}
	}
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	handshakeTimer := t.srv.cfg.Clock.AfterFunc(sshHandshakeTimeout, func() {
		cancel(fmt.Errorf("no SSH handshake within %v", sshHandshakeTimeout))
	})
	defer handshakeTimer.Stop()
	stop := context.AfterFunc(hctx, func() { conn.Close() })
	// This process's lists (ssh_kex_algorithms, ssh_ciphers, ssh_macs),
	// which the node's agree with when both run the same config.
	sconn, chans, reqs, err := ssh.NewClientConn(conn, hostAddr, t.srv.cfg.SSHAlgorithms.ClientConfig(&ssh.ClientConfig{
		User:            p.Login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: hostKeys,
	}))
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
	sess.Stdout = out
	sess.Stderr = out
	modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 14400, ssh.TTY_OP_OSPEED: 14400}
	if err := sess.RequestPty(termType, p.Rows, p.Cols, modes); err != nil {
		client.Close()
		return nil, nil, nil, trace.ConnectionProblem(err, "pty request on node %q refused: %v", node.Hostname, err)
	}
	if p.Lang != "" {
		// The browser's locale, as psh sends the user's: the node sets it
		// when it has it installed, else uses its default. No reply is
		// awaited (OpenSSH's SendEnv does not either).
		_, _ = sess.SendRequest("env", false, ssh.Marshal(struct{ Name, Value string }{"LANG", p.Lang}))
	}
	// An OpenSSH node, this cluster's or a leaf's (the leaf says so in
	// its reply), with nothing on it that records.
	recNode, recCluster, leafRequiredBy := node, t.srv.cfg.ClusterName, ""
	recorded := node.IsOpenSSH() && !route.Leaf
	if lo := route.LeafOpenSSH; route.Leaf && lo != nil {
		recorded, recCluster, leafRequiredBy = true, route.Cluster, lo.RecordingRequiredBy
		recNode = services.Node{UUID: lo.UUID, Hostname: lo.Hostname, Cluster: route.Cluster, Kind: services.NodeKindOpenSSH}
	}
	if recorded {
		// No Postern process on the node records the session: this proxy
		// does (terminal_record.go), under a session id of the
		// recordings' form.
		out.id = newRecordingID()
		out.log = out.log.WithField("terminal_id", out.id)
		if err := out.startRecording(ctx, id, recNode, recCluster, leafRequiredBy, uint32(p.Cols), uint32(p.Rows)); err != nil {
			client.Close()
			return nil, nil, nil, trace.Wrap(err)
		}
	}
	if err := sess.Shell(); err != nil {
		client.Close()
		out.abortRecording()
		return nil, nil, nil, trace.ConnectionProblem(err, "shell on node %q refused: %v", node.Hostname, err)
	}
	if node.IsOpenSSH() && !route.Leaf {
		// From now on the lock sweep (locks.go) ends it when the node
		// is locked; a lock that landed since the Router's check ends
		// it here.
		uuid := node.UUID
		out.openSSHNode.Store(&uuid)
		if locks := cfg.Locks; locks != nil {
			if err := locks.Check(services.LockTarget{Node: uuid}); services.IsLocked(err) {
				client.Close()
				out.abortRecording()
				return nil, nil, nil, trace.Wrap(err)
			}
		}
	}
	out.emitStart(ctx, recNode)
	return client, sess, stdin, nil
}

// leafOpenSSHSigner logs in to a leaf's OpenSSH node with the leaf's
// certificate for the session's key.
func leafOpenSSHSigner(key ssh.Signer, lo *proxyapi.LeafOpenSSHNode, host string) (ssh.Signer, error) {
	if lo.Cert == "" {
		why := lo.CertError
		if why == "" {
			why = "the leaf cluster sent no certificate for it"
		}
		return nil, trace.AccessDenied("node %q is an OpenSSH server, which trusts its own cluster's certificates only: %s", host, why)
	}
	if key == nil {
		return nil, trace.BadParameter("the web session has no key of its own")
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(lo.Cert))
	if err != nil {
		return nil, trace.BadParameter("the leaf cluster's certificate for node %q: %v", host, err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, trace.BadParameter("the leaf cluster sent a plain key for node %q, not a certificate", host)
	}
	s, err := ssh.NewCertSigner(cert, key)
	return s, trace.Wrap(err)
}

// readLoop carries browser frames to the session until the browser ends
// it or goes away; it returns the cause.
func (t *termSocket) readLoop(ctx context.Context, term *term) error {
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
			if err := term.writeInput(t, f.Payload); err != nil {
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
			if err := term.resize(t, size); err != nil {
				t.log.WithError(err).Debug("Window change failed.")
			}
		case webterm.FrameAck:
			// Acks only tell the server what the client rendered; the
			// buffer keeps the last replayBufferSize bytes either way,
			// so they need no bookkeeping beyond validation.
			if _, _, err := webterm.DecodeSeq(f.Payload); err != nil {
				t.log.WithError(err).Debug("Ignoring a malformed ack.")
			}
		case webterm.FrameSession:
			// The client read FrameSession: the token this socket
			// resumed with may go (termRegistry).
			term.confirmToken(t)
		case webterm.FrameEndSession:
			term.endForAll(t)
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
func (t *termSocket) keepAlive(ctx context.Context, cancel context.CancelCauseFunc) {
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
func (t *termSocket) write(typ byte, payload []byte) error {
	return t.c.Write(t.srv.web.ctx, websocket.MessageBinary, EncodeFrame(typ, payload))
}

// fail reports an error that prevented the session from starting.
func (t *termSocket) fail(err error) {
	msg := trace.UserMessage(err)
	t.log.WithError(err).Info("Web terminal failed.")
	t.finish(&sessionEnd{code: -1, err: errors.New(msg), reason: msg})
}

// finish tells the browser how the session ended and closes the socket.
func (t *termSocket) finish(end *sessionEnd) {
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

// writeData sends terminal output in the socket's dialect.
func (t *termSocket) writeData(seq uint64, p []byte) error {
	if !t.sequenced {
		return t.write(FrameData, p)
	}
	return t.c.Write(t.srv.web.ctx, websocket.MessageBinary, webterm.EncodeSeqFrame(FrameData, seq, p))
}

// leafHostKeys checks a leaf node's host certificate: signed by the host
// CA stored for route.Cluster, naming HOST.LEAF, whatever address the
// handshake was given.
func (t *termSocket) leafHostKeys(ctx context.Context, route proxy.Route) (ssh.HostKeyCallback, error) {
	get := t.srv.cfg.WebSessions.LeafHostCAs
	if get == nil {
		return nil, trace.NotFound("cluster %q not found", route.Cluster)
	}
	cas, err := get(ctx, route.Cluster)
	if err != nil {
		return nil, trace.Wrap(err, "reading the host CA of leaf cluster %q", route.Cluster)
	}
	if len(cas) == 0 {
		return nil, trace.NotFound("no host CA stored for leaf cluster %q", route.Cluster)
	}
	principal := route.Target.Host + "." + route.Cluster
	clock := t.srv.cfg.Clock
	return func(_ string, _ net.Addr, key ssh.PublicKey) error {
		return authz.CheckHostCert(cas, principal, key, clock)
	}, nil
}
