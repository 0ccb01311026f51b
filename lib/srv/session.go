package srv

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/recording/recpolicy"
	"github.com/postern-dev/postern/lib/srv/party"
)

// defaultPath is the PATH sessions start with: what Debian's login gives,
// so commands behave as they do under OpenSSH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Session environment variables a session gets (docs/reference.md).
const (
	EnvHostUUID    = "SSH_POSTERN_HOST_UUID"
	EnvClusterName = "SSH_POSTERN_CLUSTER_NAME"
	EnvUser        = "SSH_POSTERN_USER"
	EnvSessionID   = "SSH_SESSION_ID"
)

// session is one `session` channel. It owns its process and the
// goroutines copying the process's stdio (all counted in wg).
type session struct {
	c   *conn
	id  string
	ch  trackedChannel
	log logrus.FieldLogger
	// ctx ends when the channel's request stream ends (the client closed
	// the channel, or the connection died).
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards the fields below; never held while waiting on the network
	// or the process.
	mu      sync.Mutex
	env     []string
	pty     *ptyRequest
	proc    *process
	started bool
	// command is what the session runs, for the audit trail: the exec
	// command, "" for a login shell, "subsystem:NAME" for a subsystem.
	command string
	// rec records a pty session; nil when it is not recorded. Set before
	// the process starts, closed by finish.
	rec *recording.Writer
	// recKind is what rec records; recEnd is the marker written before
	// the exit status ("scp end", "sftp end"; "" for none).
	recKind recordKind
	recEnd  string
	// recCols and recRows are the terminal size last recorded.
	recCols, recRows uint32
	// recDecided says whether recording was decided for this session (a
	// proxy subsystem never is); recDecision is the decision (why it is
	// not recorded, who requires it), both for session.start.
	recDecided  bool
	recDecision recpolicy.Decision
	// recErr is the recording's first storing error; recFailed is closed
	// when it is set (the recording's OnFail), recFailAudited once the
	// recording.failed event is out.
	recErr         error
	recFailed      chan struct{}
	recFailAudited bool
	// recRequiredBy names the role that requires the recording ("" when
	// none does): a failed recording then ends the session.
	recRequiredBy string
	// recEndedSession says that the failed recording ended the session.
	recEndedSession bool
	// room is the session as others may join it (room.go); nil for a
	// session without a pty.
	room *party.Session
	// notices are the room's notices for the owner (room.go).
	notices *party.Notices
	// join is set when this channel joined another session (join.go).
	join *joined
	// ended is closed when a moderator ends the session (endOnce): a
	// session still held for its moderators has no process to hang up,
	// so its wait watches this instead (moderation.go).
	ended   chan struct{}
	endOnce sync.Once
	// chOut is the one way into the channel's data stream of a pty
	// session or a join: x/crypto's channel shares one packet buffer
	// between its writers, so the output copy and the notices (who
	// joined, who left) must never write at the same time. Closed before
	// the channel is half-closed (room.go).
	chOut closableWriter
	// eofMu orders a lock's message (tellStderr, from another goroutine)
	// against the half-close: x/crypto's channel sets and reads its
	// sent-EOF flag without a lock, so a write racing CloseWrite is a
	// data race inside the channel. Held across the write, which a lock
	// bounds by closing the connection.
	eofMu   sync.Mutex
	eofSent bool
}

// closeWrite half-closes the channel (EOF) once, never while tellStderr
// writes.
func (s *session) closeWrite() {
	s.eofMu.Lock()
	defer s.eofMu.Unlock()
	if s.eofSent {
		return
	}
	s.eofSent = true
	_ = s.ch.CloseWrite()
}

// tellStderr writes msg to the session's stderr from outside its own
// goroutines (a lock ending the connection), unless the channel is
// already half-closed.
func (s *session) tellStderr(msg string) {
	s.eofMu.Lock()
	defer s.eofMu.Unlock()
	if s.eofSent {
		return
	}
	_, _ = io.WriteString(s.ch.Stderr(), msg)
}

func (c *conn) handleSession(nch ssh.NewChannel) {
	if err := c.recheckAccess(); err != nil {
		c.log.WithField("reason", err.Error()).Warn("Session denied.")
		c.emitRefused("session", "", err.Error())
		_ = nch.Reject(ssh.Prohibited, trace.UserMessage(err))
		return
	}
	ch, reqs, err := nch.Accept()
	if err != nil {
		c.log.WithError(err).Debug("Accepting session channel failed.")
		return
	}
	s := &session{c: c, id: uuid.NewString(), ch: trackedChannel{Channel: ch, c: c, counts: &byteCounts{}}, recFailed: make(chan struct{}), ended: make(chan struct{})}
	s.chOut.w = s.ch
	s.log = c.log.WithField("session_id", s.id)
	ctx, span := c.cfg.Tracer.Start(c.ctx, "ssh.session")
	if span.IsRecording() {
		span.SetAttributes(attribute.String("postern.session_id", s.id))
	}
	defer span.End()
	s.ctx, s.cancel = context.WithCancel(ctx)
	c.addSession(s)
	defer c.removeSession(s)
	s.serve(reqs)
}

// serve runs the request loop until the client closes the channel or the
// connection ends, then stops the process and waits for its goroutines.
func (s *session) serve(reqs <-chan *ssh.Request) {
	for req := range reqs {
		s.handleRequest(req)
	}
	s.cancel()
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if proc != nil {
		proc.hangUp(s.c.cfg.Clock)
	}
	s.wg.Wait()
	_ = s.ch.Close()
	s.log.Debug("Session ended.")
}

func reply(req *ssh.Request, ok bool) {
	if req.WantReply {
		_ = req.Reply(ok, nil)
	}
}

// handleRequest serves one request of the session channel as the
// server's policy says (policy.go): what it does not list is refused.
func (s *session) handleRequest(req *ssh.Request) {
	dispatchRequest(s.c.srv.policy.session, s, s.log, req)
}

// handlePtyReq records a pty for the command to come. checkPermit is set
// on a node, where the certificate must permit a pty.
func (s *session) handlePtyReq(req *ssh.Request, checkPermit bool) {
	p, err := parsePtyRequest(req.Payload)
	if err != nil {
		s.log.WithError(err).Debug("Rejected pty-req.")
		reply(req, false)
		return
	}
	if checkPermit && !s.c.auth.permits.PTY {
		s.log.WithField("reason", "certificate does not permit a pty").Warn("Rejected pty-req.")
		reply(req, false)
		return
	}
	s.mu.Lock()
	s.pty = p
	s.mu.Unlock()
	reply(req, true)
}

func (s *session) handleEnv(req *ssh.Request) {
	var e envRequest
	if err := ssh.Unmarshal(req.Payload, &e); err != nil {
		reply(req, false)
		return
	}
	if !envAllowed(e.Name) {
		// Not fatal: like OpenSSH's AcceptEnv, a refused variable is
		// simply not set.
		s.log.WithField("name", e.Name).Debug("Ignored env request outside the allow-list.")
		reply(req, false)
		return
	}
	if isLocaleVar(e.Name) {
		if why := checkLocaleEnv(s.c.cfg.Locale, e.Name, e.Value); why != "" {
			// The node's default locale applies instead (buildEnv).
			s.log.WithFields(logrus.Fields{"name": e.Name, "value": e.Value, "reason": why}).Info("Ignored a locale env request.")
			reply(req, false)
			return
		}
	}
	s.mu.Lock()
	s.env = append(s.env, e.Name+"="+e.Value)
	s.mu.Unlock()
	reply(req, true)
}

func (s *session) handleShell(req *ssh.Request) {
	s.startCommand(req, "", false)
}

func (s *session) handleExec(req *ssh.Request) {
	var e execRequest
	if err := ssh.Unmarshal(req.Payload, &e); err != nil {
		reply(req, false)
		return
	}
	s.startCommand(req, e.Command, true)
}

// handleSubsystem claims the session for a subsystem and starts it as the
// policy says.
func (s *session) handleSubsystem(req *ssh.Request) {
	var r subsystemRequest
	if err := ssh.Unmarshal(req.Payload, &r); err != nil {
		reply(req, false)
		return
	}
	s.setCommand("subsystem:" + r.Name)
	if !s.claim() {
		reply(req, false)
		return
	}
	s.c.srv.policy.subsystem(s, req, r.Name)
}

func (s *session) handleWindowChange(req *ssh.Request) {
	w, err := parseWindowChange(req.Payload)
	if err == nil {
		err = s.resize(w)
	}
	if err != nil {
		s.log.WithError(err).Debug("window-change failed.")
	}
	reply(req, err == nil)
}

func (s *session) handleSignal(req *ssh.Request) {
	sig, err := parseSignal(req.Payload)
	if j := s.joinedSession(); j != nil && err == nil {
		s.signalJoined(req, j, sig)
		return
	}
	if err == nil {
		err = s.signal(sig)
	}
	if err != nil {
		s.log.WithError(err).Debug("signal failed.")
	}
	reply(req, err == nil)
}

func (s *session) refuseX11(req *ssh.Request) {
	s.log.Debug("Refused x11-req: X11 forwarding is not supported.")
	reply(req, false)
}

// claim marks the session as running something; a session runs one
// command, shell or subsystem (RFC 4254 section 6.5).
func (s *session) claim() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return false
	}
	s.started = true
	return true
}

// refuse tells the client why, on stderr, and fails the request.
func (s *session) refuse(req *ssh.Request, err error) {
	s.log.WithError(err).Warn("Session request refused.")
	_, _ = fmt.Fprintf(s.ch.Stderr(), "postern: %v\r\n", trace.UserMessage(err))
	reply(req, false)
}

// exitNotStarted is the exit status of a command the node could not start:
// OpenSSH's own for "the command never ran", so that `ssh` and `psh ssh`
// exit 255 for it too.
const exitNotStarted = 255

// failStart ends a shell or exec the node cannot start for a reason the
// user must read (a login that does not exist here), the way sshd ends an
// exec that failed: the request is accepted, the reason goes to stderr and
// the channel ends with an exit status. A refused request would lose the
// reason: OpenSSH prints only "exec request failed on channel 0".
func (s *session) failStart(req *ssh.Request, err error) {
	s.log.WithError(err).Warn("Session command cannot start.")
	reply(req, true)
	_, _ = fmt.Fprintf(s.ch.Stderr(), "postern: %v\r\n", trace.UserMessage(err))
	s.closeWrite()
	_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{Status: exitNotStarted}))
	_ = s.ch.Close()
}

func (s *session) startCommand(req *ssh.Request, command string, isExec bool) {
	if !s.claim() {
		reply(req, false)
		return
	}
	s.setCommand(command)
	login, cred, err := s.c.resolveLogin()
	if err != nil {
		s.failStart(req, err)
		return
	}
	args := []string{"-" + filepath.Base(login.Shell)}
	if isExec {
		args = []string{filepath.Base(login.Shell), "-c", command}
	}
	s.mu.Lock()
	ptyReq := s.pty
	s.mu.Unlock()
	spec := procSpec{path: login.Shell, args: args, cred: cred, pty: ptyReq}
	spec.env, err = s.buildEnv(login, ptyReq)
	if err != nil {
		s.refuse(req, err)
		return
	}
	spec.dir = homeOrRoot(login.Home)
	if spec.dir != login.Home {
		_, _ = fmt.Fprintf(s.ch.Stderr(), "Could not chdir to home directory %s: using /\r\n", login.Home)
	}
	s.run(req, spec)
}

// run starts spec, answers req, and sends the exit status when it ends.
func (s *session) run(req *ssh.Request, spec procSpec) {
	if rules, err := s.moderationRules(spec); err != nil || len(rules) > 0 {
		if err != nil {
			s.refuse(req, err)
			return
		}
		s.runModerated(req, spec, rules)
		return
	}
	if err := s.launch(spec, func() { reply(req, true) }); err != nil {
		s.refuse(req, err)
	}
}

// launch starts spec with its recording; started is called once the
// process runs, before the goroutines that watch it start.
func (s *session) launch(spec procSpec, started func()) error {
	rec, err := s.startRecording(spec)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.rec = rec
	s.mu.Unlock()
	proc, err := s.startProcess(spec)
	if err != nil {
		if rec != nil {
			_, _ = rec.Close("start failed: " + trace.UserMessage(err))
		}
		return trace.Wrap(err, "starting %s", spec.path)
	}
	s.mu.Lock()
	s.proc = proc
	s.mu.Unlock()
	s.log.WithFields(logrus.Fields{"pty": spec.pty != nil, "pid": proc.cmd.Process.Pid}).Info("Session started.")
	s.emitStart(spec.pty != nil)
	started()
	if rec != nil {
		s.goCopy(func() { s.watchRecording(proc.exited, func() { proc.hangUp(s.c.cfg.Clock) }) })
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		st := proc.wait(s.ctx, s.c.cfg.Clock)
		s.finish(st)
	}()
	return nil
}

// finish ends the channel the way OpenSSH does: output already drained,
// then EOF, exit-status (or exit-signal), close.
func (s *session) finish(st exitResult) {
	s.closeRoom()
	s.tellRecordingEnded()
	s.closeWrite()
	if st.signal != "" {
		_, _ = s.ch.SendRequest("exit-signal", false, ssh.Marshal(exitSignal{Signal: st.signal, CoreDumped: st.core}))
	} else {
		_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{Status: st.code}))
	}
	_ = s.ch.Close()
	s.log.WithFields(logrus.Fields{"exit_status": st.code, "exit_signal": st.signal}).Info("Session process ended.")
	fields := events.Fields{
		events.FieldSessionID: s.id, events.FieldExitCode: st.code, "exit_signal": st.signal,
		events.FieldBytesIn: s.ch.counts.in.Load(), events.FieldBytesOut: s.ch.counts.out.Load(),
	}
	s.closeRecording(st, fields)
	s.c.emit(events.SessionEnd, fields)
}

// buildEnv is the session's environment: the allowed client variables
// first, then the ones the server sets, which therefore win.
func (s *session) buildEnv(login *Login, ptyReq *ptyRequest) ([]string, error) {
	s.mu.Lock()
	env := append([]string(nil), s.env...)
	s.mu.Unlock()
	env = withDefaultLocale(env, s.c.cfg.Locale.Default)
	node := s.c.auth.node
	env = append(env,
		"HOME="+login.Home,
		"USER="+login.Name,
		"LOGNAME="+login.Name,
		"SHELL="+login.Shell,
		"PATH="+defaultPath,
		EnvHostUUID+"="+node.UUID,
		EnvClusterName+"="+s.c.cfg.ClusterName,
		EnvUser+"="+s.c.auth.id.User,
		EnvSessionID+"="+s.id,
	)
	if ptyReq != nil && ptyReq.Term != "" {
		env = append(env, "TERM="+ptyReq.Term)
	}
	if ra, ok := s.c.nc.RemoteAddr().(*net.TCPAddr); ok {
		if la, ok := s.c.nc.LocalAddr().(*net.TCPAddr); ok {
			env = append(env,
				fmt.Sprintf("SSH_CLIENT=%s %d %d", ra.IP, ra.Port, la.Port),
				fmt.Sprintf("SSH_CONNECTION=%s %d %s %d", ra.IP, ra.Port, la.IP, la.Port))
		}
	}
	sock, err := s.c.agentSocketFor(login)
	if err != nil {
		return nil, trace.Wrap(err, "agent forwarding")
	}
	if sock != "" {
		env = append(env, "SSH_AUTH_SOCK="+sock)
	}
	return env, nil
}

func homeOrRoot(home string) string {
	if fi, err := os.Stat(home); err == nil && fi.IsDir() {
		return home
	}
	return "/"
}

// resolveLogin looks the connection's login up and decides the process
// credentials.
func (c *conn) resolveLogin() (*Login, *syscall.Credential, error) {
	login, err := c.cfg.LookupLogin(c.auth.id.Login)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	cred, err := credentialFor(login)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	return login, cred, nil
}

func (s *session) resize(w *windowChange) error {
	s.mu.Lock()
	if s.pty == nil {
		s.mu.Unlock()
		return trace.BadParameter("window-change without a pty")
	}
	s.pty.Columns, s.pty.Rows, s.pty.WidthPx, s.pty.HeightPx = w.Columns, w.Rows, w.WidthPx, w.HeightPx
	rec := s.rec
	var err error
	if s.proc != nil && s.proc.ptmx != nil {
		err = setWinsize(s.proc.ptmx, w.Columns, w.Rows, w.WidthPx, w.HeightPx)
	}
	s.mu.Unlock()
	s.resizeRoom(w.Columns, w.Rows)
	if rec != nil {
		s.recordSize(rec, w.Columns, w.Rows)
	}
	return trace.Wrap(err)
}

func (s *session) signal(sig syscall.Signal) error {
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if proc == nil {
		return trace.BadParameter("no process to signal")
	}
	s.log.WithField("signal", signalName(sig)).Debug("Signalling the session process group.")
	return proc.kill(sig)
}

// exitResult is how a process ended.
type exitResult struct {
	code   uint32
	signal string
	core   bool
}

func exitCode(code int) exitResult { return exitResult{code: uint32(code)} }

func (s *session) setCommand(cmd string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.command = cmd
}

func (s *session) getCommand() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.command
}

// emitStart records session.start; session.end comes from finish, which
// every way a session ends goes through.
//
// A session whose recording was decided says whether it is recorded and,
// when not, why (an exempting role, the cluster setting, a node that does
// not record): a session missing from the recordings is explained in the
// audit trail, never silently absent. A recorded session says the
// recording's size cap (max_recording_bytes).
func (s *session) emitStart(pty bool) {
	fields := events.Fields{events.FieldSessionID: s.id, events.FieldCommand: s.getCommand(), "pty": pty}
	s.mu.Lock()
	if s.recDecided {
		// The cap in effect, as the writer has it: an auditor reads how
		// much of the session the recording may hold.
		var maxBytes int64
		if s.rec != nil {
			maxBytes = s.rec.MaxBytes()
		}
		recpolicy.AddStartFields(fields, s.recDecision, maxBytes)
	}
	s.mu.Unlock()
	s.c.emit(events.SessionStart, fields)
}
