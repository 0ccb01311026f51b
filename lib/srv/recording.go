package srv

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/recording/recpolicy"
	"github.com/postern-dev/postern/lib/services"
)

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// Spool is where chunks are written as they close (the node's
	// DATA_DIR/recordings). Required.
	Spool recording.DirStorage
	// Settings returns the cluster's recording settings (session_recording,
	// record_input, max_recording_bytes in the networking config). It is
	// called once per session: the node has no cached networking view yet,
	// so a change applies to the sessions that start after it. Required.
	Settings func(ctx context.Context) (*services.ClusterNetworkingConfig, error)
	// Notify is called when a chunk is on disk (the uploader's Notify).
	// Nil means nobody is told.
	Notify func()
	// Clock times the events; nil means the real clock.
	Clock clockwork.Clock
}

// Recorder starts the recordings of a node's pty sessions.
type Recorder struct{ cfg RecorderConfig }

// NewRecorder checks cfg.
func NewRecorder(cfg RecorderConfig) (*Recorder, error) {
	if cfg.Spool.Dir == "" {
		return nil, trace.BadParameter("srv recorder: missing Spool")
	}
	if cfg.Settings == nil {
		return nil, trace.BadParameter("srv recorder: missing Settings")
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	return &Recorder{cfg: cfg}, nil
}

// Which sessions are recorded, and how. A pty session records its output,
// resizes and (with record_input) input; an exec without a pty records its
// output (stdout and stderr, as "o" events, bytes as sent: an exec has no
// terminal) and its exit status. File transfers record markers, not the
// files: scp (an exec of `scp -t` or `scp -f`) and the sftp subsystem get
// "scp start"/"sftp start" and "... end" markers around the exit status.
// Every recording of a connection gets an "agent" marker each time a
// process on the node uses the forwarded agent.
type recordKind int

const (
	recordTerminal recordKind = iota // pty: output, resize, input
	recordOutput                     // exec without a pty: output
	recordMarkers                    // scp, sftp: markers only
)

// noPtySize is the header size of a recording without a pty: asciicast
// needs one, and 80x24 is what a terminal opens with.
const noPtyCols, noPtyRows = recording.DefaultWidth, recording.DefaultHeight

// scpMarker reports whether command is an scp server (`scp -t PATH`
// receives an upload, `scp -f PATH` sends a download) and describes it.
func scpMarker(command string) (string, bool) {
	f := strings.Fields(command)
	if len(f) < 2 || path.Base(f[0]) != "scp" {
		return "", false
	}
	dir, target := "", ""
	for _, a := range f[1:] {
		switch {
		case strings.HasPrefix(a, "-") && strings.Contains(a, "t") && !strings.HasPrefix(a, "--"):
			dir = "upload to"
		case strings.HasPrefix(a, "-") && strings.Contains(a, "f") && !strings.HasPrefix(a, "--"):
			dir = "download of"
		case !strings.HasPrefix(a, "-"):
			target = a
		}
	}
	if dir == "" {
		return "", false
	}
	return strings.TrimSpace("scp start: " + dir + " " + target), true
}

// startRecording decides whether the session is recorded and starts its
// recording (nil when it is not recorded). The cluster's
// session_recording decides, unless the user's roles say otherwise:
// a role with session_recording: require records the session even when
// the cluster says off, exempt leaves it unrecorded when no role requires
// it (services.AccessChecker.RecordingPolicy).
//
// Without require, a failure to start is logged and the session runs
// unrecorded: like the cap, recording never costs the user their session
// (the missing recording is visible in listings, the reason in
// session.start and the node's log). With require it is the other way
// round, deny by default: a required recording that cannot be made
// (a node that does not record, settings that cannot be read, a spool
// that cannot be written) refuses the session with an error naming the
// role, because whoever wrote the role chose an audit trail over access.
func (s *session) startRecording(spec procSpec) (*recording.Writer, error) {
	command := s.getCommand()
	kind := recordOutput
	start := ""
	switch {
	case spec.pty != nil:
		kind = recordTerminal
		if command != "" {
			start = "exec: " + command
		}
	case strings.HasPrefix(command, "subsystem:"):
		kind, start = recordMarkers, strings.TrimPrefix(command, "subsystem:")+" start"
	default:
		if m, ok := scpMarker(command); ok {
			kind, start = recordMarkers, m
		} else if command != "" {
			start = "exec: " + command
		}
	}
	return s.startRecordingKind(spec.pty, kind, start)
}

// recordingInput is what the node's decision depends on: its recorder
// and the user's roles.
func (s *session) recordingInput() recpolicy.Input {
	in := recpolicy.Input{Recorder: recpolicy.Node}
	if r := s.c.cfg.Recorder; r != nil {
		in.Settings = r.cfg.Settings
	}
	if s.c.auth != nil && s.c.auth.id != nil && s.c.auth.id.Checker != nil {
		in.Mode, in.Role = s.c.auth.id.Checker.RecordingPolicy()
	}
	return in
}

// recordingSubject is the session as its recording events name it
// (recpolicy.Subject: the same fields as the proxy's web terminals).
func (s *session) recordingSubject() recpolicy.Subject {
	sub := recpolicy.Subject{Method: auditMethodSSH, Kind: auditKindSession, SessionID: s.id, Target: s.getCommand()}
	if s.c.auth != nil && s.c.auth.id != nil {
		sub.Login = s.c.auth.id.Login
		sub.ServerID, sub.ServerHostname = s.c.auth.node.UUID, s.c.auth.node.Hostname
	}
	if s.c.nc != nil {
		sub.RemoteAddr = s.c.nc.RemoteAddr().String()
	}
	return sub
}

// The node's recording events carry method "ssh" and kind "session", as
// the proxy's carry "web" and "terminal".
const (
	auditMethodSSH   = "ssh"
	auditKindSession = "session"
)

// decided notes the recording decision, for session.start; a refused
// session is audited like any other refusal (access.denied) and the user
// reads why.
func (s *session) decided(d recpolicy.Decision) error {
	s.mu.Lock()
	s.recDecided, s.recDecision = true, d
	s.mu.Unlock()
	if d.Refused {
		s.c.emit(events.AccessDenied, recpolicy.RefusedFields(s.recordingSubject(), d))
		return d.Err()
	}
	return nil
}

// startRecordingKind decides (recpolicy.Decide, as the proxy does for its
// web terminals) and starts the recording.
func (s *session) startRecordingKind(pty *ptyRequest, kind recordKind, startMarker string) (*recording.Writer, error) {
	d := recpolicy.Decide(s.ctx, s.recordingInput())
	if d.SettingsErr != nil {
		s.log.WithError(d.SettingsErr).Warn("Reading the recording settings failed.")
	}
	if !d.Record {
		return nil, s.decided(d)
	}
	r := s.c.cfg.Recorder
	// The subject, once: OnCap runs on the writer's side, where the
	// session's lock is not ours to take.
	sub := s.recordingSubject()
	node := s.c.auth.node
	h := recording.Header{
		Width: noPtyCols, Height: noPtyRows, Command: s.getCommand(),
		SessionID: s.id, User: s.c.auth.id.User, Login: s.c.auth.id.Login,
		Node: node.UUID, NodeHostname: node.Hostname, Cluster: s.c.cfg.ClusterName,
	}
	if pty != nil {
		h.Width, h.Height = pty.Columns, pty.Rows
		s.mu.Lock()
		s.recCols, s.recRows = pty.Columns, pty.Rows
		s.mu.Unlock()
		if pty.Term != "" {
			h.Env = map[string]string{"TERM": pty.Term}
		}
	}
	w, err := recording.New(recording.Config{
		Header:      h,
		Sink:        &recording.SpoolSink{Storage: r.cfg.Spool, Session: s.id, Notify: r.cfg.Notify, Clock: r.cfg.Clock},
		Deps:        observe.Deps{Clock: r.cfg.Clock, Logger: s.log},
		MaxBytes:    d.MaxBytes(),
		RecordInput: d.RecordInput() && kind == recordTerminal,
		OnCap: func() {
			s.log.WithField("max_recording_bytes", d.MaxBytes()).Warn("Recording reached its cap and stopped; the session goes on.")
			s.c.emit(events.RecordingCapped, recpolicy.CappedFields(sub, d.MaxBytes()))
		},
		OnFail: s.noteRecordingFailed,
	})
	if err != nil {
		s.log.WithError(err).Warn("Starting the recording failed.")
		return nil, s.decided(d.StartFailed(recpolicy.ReasonNotStarted))
	}
	if startMarker != "" {
		w.Marker(startMarker)
	}
	// The probe: the header (and the start marker) are stored before the
	// process starts, so that "recorded" in session.start means the spool
	// took the recording's first chunk, and a spool that cannot be
	// written (read-only, immutable, full) is known now rather than at
	// the session's end.
	if err := w.Sync(); err != nil {
		_, _ = w.Close("")
		// Not a recording that failed mid-session: one that never was.
		s.mu.Lock()
		s.recErr, s.recFailed = nil, make(chan struct{})
		s.mu.Unlock()
		s.log.WithError(err).Warn("The recording spool cannot be written.")
		return nil, s.decided(d.StartFailed(recpolicy.ReasonSpoolUnwritable(recpolicy.Node)))
	}
	s.mu.Lock()
	s.recRequiredBy = d.RequiredBy
	s.recDecided, s.recDecision = true, d
	s.recKind = kind
	s.recEnd = ""
	if kind == recordMarkers {
		s.recEnd = strings.Fields(startMarker)[0] + " end"
	}
	s.mu.Unlock()
	return w, nil
}

// outputRecorder tees dst into record: with requireRecorded when a role
// requires the recording, else with recorded.
func (s *session) outputRecorder(dst io.Writer, w *recording.Writer, record func([]byte)) io.Writer {
	s.mu.Lock()
	required := s.recRequiredBy != ""
	s.mu.Unlock()
	if required {
		return requireRecorded(dst, record, w.Failed)
	}
	return recorded(dst, record)
}

// recordsOutput reports whether the session's output goes into its
// recording (not for file transfers).
func (s *session) recordsOutput() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec != nil && s.recKind != recordMarkers
}

// markAgentUse puts an agent marker into every recording of the
// connection: a process on the node is using the forwarded agent.
func (c *conn) markAgentUse() {
	c.mu.Lock()
	sessions := make([]*session, 0, len(c.sessions))
	for s := range c.sessions {
		sessions = append(sessions, s)
	}
	c.mu.Unlock()
	for _, s := range sessions {
		s.mu.Lock()
		w := s.rec
		s.mu.Unlock()
		if w != nil {
			w.Marker("agent: forwarded agent used")
		}
	}
}

// recorded tees dst: what is written goes to dst and then, if dst took
// it, to record. record never fails, so the copy's behaviour is dst's.
func recorded(dst io.Writer, record func([]byte)) io.Writer {
	return recordingWriter{dst: dst, record: record}
}

// requireRecorded is recorded for a session whose role requires
// recording: once the recording has failed (failed reports it) nothing
// more goes to dst, so that the user sees no output that is not
// recorded, and the copy ends.
func requireRecorded(dst io.Writer, record func([]byte), failed func() bool) io.Writer {
	return recordingWriter{dst: dst, record: record, failed: failed}
}

var errRecordingStopped = trace.AccessDenied("session recording failed")

type recordingWriter struct {
	dst    io.Writer
	record func([]byte)
	failed func() bool // nil: the copy goes on whatever the recording does
}

func (w recordingWriter) Write(p []byte) (int, error) {
	if w.failed != nil && w.failed() {
		return 0, errRecordingStopped
	}
	n, err := w.dst.Write(p)
	if n > 0 {
		w.record(p[:n])
	}
	return n, err
}

// exitLabel is the recording's last marker.
func exitLabel(st exitResult) string {
	if st.signal != "" {
		return "exit-signal " + st.signal
	}
	return fmt.Sprintf("exit-status %d", st.code)
}

// errRecordingFailed is the reason of a recording that failed after it
// started.
var errRecordingFailed = recpolicy.ReasonFailed(recpolicy.Node)

// closeRecording ends the recording with the exit marker and notes in
// fields (session.end's) whether it was stored: recorded true and the
// final hash only when every chunk was; recorded false with the reason
// when one was not (and recording.failed is audited, if it was not yet).
func (s *session) closeRecording(st exitResult, fields events.Fields) {
	s.mu.Lock()
	w, end := s.rec, s.recEnd
	s.mu.Unlock()
	if w == nil {
		return
	}
	if end != "" {
		w.Marker(end)
	}
	final, err := w.Close(exitLabel(st))
	if err != nil {
		s.log.WithError(err).Warn("Recording is incomplete: a chunk could not be stored.")
		s.noteRecordingFailed(err)
		s.auditRecordingFailed()
		fields[events.FieldRecorded] = false
		fields[events.FieldRecordingReason] = errRecordingFailed
		return
	}
	fields[events.FieldRecorded] = true
	fields[events.FieldRecordingHash] = final
}

// noteRecordingFailed is the writer's OnFail (called from its store
// goroutine, and again by closeRecording): it notes the first error and
// wakes watchRecording, without blocking.
func (s *session) noteRecordingFailed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recErr == nil {
		s.recErr = err
		close(s.recFailed)
	}
}

// auditRecordingFailed emits recording.failed once per session.
func (s *session) auditRecordingFailed() {
	s.mu.Lock()
	done, role := s.recFailAudited, s.recRequiredBy
	s.recFailAudited = true
	s.mu.Unlock()
	if done {
		return
	}
	s.c.emit(events.RecordingFailed, recpolicy.FailedFields(s.recordingSubject(), recpolicy.Node, role))
}

// watchRecording acts on a recording that fails while the session runs
// (stop is closed when the session's process or server has ended: a
// failure from then on is closeRecording's to report). The failure is
// audited at once. A session whose role requires recording is then ended
// (end stops the process; finish tells the user why on stderr); its output copy
// has already stopped (recordedWriter), so nothing is shown that is not
// recorded, but for what was in flight when the spool failed (at most a
// chunk, DefaultFlushInterval of output). Any other session goes on
// unrecorded, as it would have had the spool failed before it began.
func (s *session) watchRecording(stop <-chan struct{}, end func()) {
	select {
	case <-stop:
		return
	case <-s.recFailed:
	}
	select {
	case <-stop:
		return
	default:
	}
	s.mu.Lock()
	role := s.recRequiredBy
	s.mu.Unlock()
	s.auditRecordingFailed()
	if role == "" {
		s.log.Warn("Recording failed; the session goes on unrecorded.")
		return
	}
	s.log.WithField("required_by", role).Warn("Recording failed; the session requires recording and is ended.")
	s.mu.Lock()
	s.recEndedSession = true
	s.mu.Unlock()
	end()
}

// tellRecordingEnded writes, from finish (the one writer of the channel
// once the output is drained, before its EOF), why the session was ended
// when watchRecording ended it.
func (s *session) tellRecordingEnded() {
	s.mu.Lock()
	ended, d := s.recEndedSession, s.recDecision
	s.mu.Unlock()
	if ended {
		_, _ = fmt.Fprintf(s.ch.Stderr(), "\r\npostern: %s\r\n", d.EndedMessage())
	}
}

// sizePollInterval is how often, at most, a recorded pty's size is read
// back from the kernel: a program inside may resize its own terminal
// (`stty cols 100`, resize(1)) without any window-change from the client,
// and the recording must show what the screen was.
const sizePollInterval = 100 * time.Millisecond

// ptyOutputRecorder records a pty's output, first recording a resize when
// the pty's size changed since the last one recorded (read at most every
// sizePollInterval, on output: a size change shows only when something is
// drawn).
func (s *session) ptyOutputRecorder(w *recording.Writer, ptmx *os.File, clock clockwork.Clock) func([]byte) {
	var checked time.Time
	return func(p []byte) {
		if now := clock.Now(); now.Sub(checked) >= sizePollInterval {
			checked = now
			if cols, rows, err := getWinsize(ptmx); err == nil {
				s.recordSize(w, cols, rows)
			}
		}
		w.Output(p)
	}
}

// recordSize records a resize when cols x rows is not the size last
// recorded (the client's window-change and the kernel's view both come
// here, so one change is recorded once).
func (s *session) recordSize(w *recording.Writer, cols, rows uint32) {
	s.mu.Lock()
	changed := s.recCols != cols || s.recRows != rows
	s.recCols, s.recRows = cols, rows
	s.mu.Unlock()
	if changed {
		w.Resize(cols, rows)
	}
}
