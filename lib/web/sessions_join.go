package web

import (
	"context"
	"io"
	"net/http"
	"strconv"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/sessionapi"
	"github.com/postern-dev/postern/lib/api/webterm"
)

// joinSession serves GET /webapi/sessions/{id}/join?mode=MODE: the
// browser joins another user's live session, as psh join does. The
// socket is the terminal's (same subprotocol, first message and frames,
// termSocket and term): only how the SSH session on the node is opened
// differs (connectJoin). The id and mode are checked before the upgrade
// and answered 400 with what was wrong; whether the session exists and
// may be joined is answered only after the socket authenticated, and a
// session the user may not join fails exactly as a missing one.
func (s *Server) joinSession(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.WebSessions.enabled() {
		writeError(w, http.StatusNotImplemented, "web sessions are not available on this proxy")
		return
	}
	sid, err := sessionapi.ParseSessionID(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
		return
	}
	mode := sessionapi.Observer
	if m := r.URL.Query().Get("mode"); m != "" {
		if mode, err = sessionapi.ParseMode(m); err != nil {
			writeError(w, http.StatusBadRequest, trace.UserMessage(err))
			return
		}
	}
	if c := r.URL.Query().Get("cluster"); c != "" && c != s.cfg.ClusterName {
		// The active sessions list is the local cluster's: a leaf's
		// sessions are joined with psh join --cluster.
		writeError(w, http.StatusBadRequest, "joining a session of cluster "+strconv.Quote(c)+" from the web is not supported (use psh join --cluster)")
		return
	}
	size := TermSize{Cols: 80, Rows: 24}
	for name, dst := range map[string]*int{"cols": &size.Cols, "rows": &size.Rows} {
		if v := r.URL.Query().Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				writeError(w, http.StatusBadRequest, "malformed "+name+" "+strconv.Quote(truncateReason(v))+": want a number")
				return
			}
			*dst = n
		}
	}
	if err := size.Check(); err != nil {
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
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
	log = log.WithField("joined_session", sid)
	sock := &termSocket{srv: s, c: c, live: live, log: log, remoteAddr: r.RemoteAddr, sequenced: msg.Ack != nil}
	if msg.Resume != "" {
		sock.fail(trace.BadParameter("a joined session is not resumed: join it again"))
		return
	}
	if err := writeOK(s.web.ctx, c); err != nil {
		return
	}
	// Host names the session until the node is found (logs, keep-alive).
	params := &TerminalParams{Host: sid, Cols: size.Cols, Rows: size.Rows}
	t, err := s.launchTerm(r.Context(), live, params, sock, mode, func(ctx context.Context, p *TerminalParams, out *term) (*ssh.Client, *ssh.Session, io.WriteCloser, error) {
		return sock.connectJoin(ctx, sid, mode, out)
	})
	if err != nil {
		sock.fail(err)
		return
	}
	sock.log = t.log
	t.log.WithField("mode", mode).Info("Joined a session from the web.")
	sock.serve(t, 0)
}

// connectJoin finds the node holding session sid among those the user
// may reach (each asked as the user, as for the active sessions list)
// and opens its join subsystem in mode there. Every refusal (no such
// session, not joinable by this user, not in this mode) is the same
// NotFound: a session's existence is never revealed to a user who may
// not join it; the node's audit trail has the real reason.
func (t *termSocket) connectJoin(ctx context.Context, sid string, mode sessionapi.Mode, out *term) (*ssh.Client, *ssh.Session, io.WriteCloser, error) {
	s := t.srv
	notFound := trace.NotFound("session %v not found", sid)
	id, err := s.identity(ctx, t.live)
	if err != nil {
		return nil, nil, nil, trace.Wrap(err)
	}
	all, err := s.activeSessions(ctx, t.live, id)
	if err != nil {
		return nil, nil, nil, trace.Wrap(err)
	}
	var found *ActiveSession
	for i := range all {
		if all[i].ID == sid {
			found = &all[i]
		}
	}
	if found == nil {
		t.log.Info("Join refused: no joinable session with that id.")
		return nil, nil, nil, notFound
	}
	client, err := s.dialNodeAsUser(ctx, t.live, id, found.node)
	if err != nil || client == nil {
		t.log.WithError(err).Info("Join refused: the node holding the session cannot be reached.")
		return nil, nil, nil, notFound
	}
	out.nodeHostname, out.nodeUUID, out.cluster = found.node.Hostname, found.node.UUID, s.cfg.ClusterName
	out.params.Login = found.Login
	sess, err := client.NewSession()
	if err != nil {
		client.Close()
		return nil, nil, nil, trace.ConnectionProblem(err, "opening a session on node %q: %v", found.node.Hostname, err)
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		client.Close()
		return nil, nil, nil, trace.Wrap(err)
	}
	stdout, err := sess.StdoutPipe()
	if err != nil {
		client.Close()
		return nil, nil, nil, trace.Wrap(err)
	}
	stderr, err := sess.StderrPipe()
	if err != nil {
		client.Close()
		return nil, nil, nil, trace.Wrap(err)
	}
	if err := sess.RequestSubsystem(sessionapi.JoinSubsystem(sid, mode)); err != nil {
		client.Close()
		t.log.WithError(err).WithField("mode", mode).Info("Join refused by the node.")
		return nil, nil, nil, notFound
	}
	// A subsystem's output is not copied by x/crypto (it starts no
	// copy for it, and its Wait refuses): the node ends the joined
	// channel (exit status 0) when the session ends or the party
	// leaves, which ends both copies and so the terminal. Closing the
	// client ends them too.
	errDone := make(chan struct{})
	outDone := make(chan struct{})
	go func() {
		defer close(errDone)
		_, _ = io.Copy(out, stderr)
	}()
	go func() {
		defer close(outDone)
		_, _ = io.Copy(out, stdout)
	}()
	out.wait = func() error {
		<-outDone
		<-errDone
		return nil
	}
	return client, sess, stdin, nil
}

// endForAll is a browser's "End session": a moderator's ends the joined
// session for everyone (the node's moderator signal, as psh join's
// `Ctrl-] t`); anyone else is told it is not theirs to end.
func (t *term) endForAll(sock *termSocket) {
	t.mu.Lock()
	attached := t.att == sock
	t.mu.Unlock()
	if !attached {
		return
	}
	if t.joinMode != sessionapi.Moderator {
		_ = sock.write(webterm.FrameNotice, []byte("Only a moderator of a joined session can end it for everyone."))
		return
	}
	if err := t.sess.Signal(ssh.SIGHUP); err != nil {
		t.log.WithError(err).Info("The moderator's end did not reach the node.")
		return
	}
	t.log.Info("A moderator ended the joined session from the web.")
}
