package web

import (
	"context"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// TerminalRecorder records this proxy's web terminals to OpenSSH nodes.
// A Postern node records its own sessions; a stock sshd records nothing,
// and for a web terminal the proxy is the SSH client that sees the whole
// session, so it records it: the same writer, chunks and hash chain as a
// node's, spooled under the proxy's data dir and uploaded to auth (which
// accepts a proxy's chunks for OpenSSH nodes' sessions only).
type TerminalRecorder struct {
	// Spool is where chunks are written as they close. Required.
	Spool recording.DirStorage
	// Settings returns the cluster's recording settings, read once per
	// terminal. Required.
	Settings func(ctx context.Context) (*services.ClusterNetworkingConfig, error)
	// Notify is called when a chunk is on disk (the uploader's Notify);
	// nil means nobody is told.
	Notify func()
}

func (r *TerminalRecorder) check() error {
	if r == nil {
		return nil
	}
	if r.Spool.Dir == "" {
		return trace.BadParameter("web: WebSessions.Recorder is set but its Spool is missing")
	}
	if r.Settings == nil {
		return trace.BadParameter("web: WebSessions.Recorder is set but its Settings is missing")
	}
	return nil
}

// termRecording is the state of a recorded terminal (nil fields: the
// terminal is not one the proxy records).
type termRecording struct {
	// decided: the proxy decides the recording of this terminal (an
	// OpenSSH node); reason is why it is not recorded.
	decided bool
	reason  string
	w       *recording.Writer
	// requiredBy names the role that requires the recording: output the
	// recording did not take is not shown, and the terminal ends.
	requiredBy string
	// failOnce emits recording.failed once per terminal.
	failOnce sync.Once
}

// auditFailed emits recording.failed once, as a node does for its
// sessions.
func (t *term) auditFailed(ctx context.Context, role string) {
	t.rec.failOnce.Do(func() {
		fields := events.Fields{events.FieldMethod: auditMethod, events.FieldKind: auditKind, events.FieldSessionID: t.id, events.FieldReason: errProxyRecordingFailed}
		if role != "" {
			fields["required_by"] = role
		}
		t.srv.cfg.WebSessions.Audit.Emit(context.WithoutCancel(ctx), events.Event{Type: events.RecordingFailed, User: t.live.user, Fields: fields})
	})
}

// startRecording decides, as a node does for its sessions, whether the
// terminal to OpenSSH node is recorded, and starts its recording. The
// cluster's session_recording decides unless the user's roles require or
// exempt it. Without require a recording that cannot start leaves the
// terminal unrecorded (and says why in session.start); with require the
// terminal is refused, naming the role. It runs before the shell starts,
// so that nothing is typed that is not recorded.
//
// cluster is the cluster that owns node: this one, or a leaf whose
// OpenSSH node the terminal reached through it (leafRequiredBy then
// names the leaf role, among those the user's roles map to there, that
// requires a recording). A leaf's OpenSSH node is recorded here, by the
// root proxy, and stored in the root cluster: the session's SSH client
// runs here and nowhere else sees it in clear (the leaf's proxy splices
// the encrypted stream; recording there would take the user's key to the
// leaf, a signing oracle for a certificate the root and every leaf
// accept), and this proxy can hand a recording only to its own
// cluster's auth server. So the root's settings and the user's own roles
// decide, as for a local node, and a leaf role's require is honoured on
// top: such a terminal is recorded whatever the root says, or refused.
func (t *term) startRecording(ctx context.Context, id *authz.Identity, node services.Node, cluster, leafRequiredBy string, cols, rows uint32) error {
	rec := &t.rec
	rec.decided = true
	mode, role := "", ""
	if id.Checker != nil {
		mode, role = id.Checker.RecordingPolicy()
	}
	who := fmt.Sprintf("role %q", role)
	required := mode == services.RecordingRequire
	if !required && leafRequiredBy != "" {
		required, role = true, leafRequiredBy
		who = fmt.Sprintf("role %q of cluster %q", role, cluster)
	}
	refuse := func(why string) error {
		reason := fmt.Sprintf("session recording is required by %s and %s", who, why)
		t.srv.cfg.WebSessions.Audit.Emit(ctx, events.Event{Type: events.AccessDenied, User: t.live.user, Fields: events.Fields{
			events.FieldMethod: auditMethod, events.FieldKind: auditKind, events.FieldTarget: t.params.Host,
			events.FieldLogin: t.params.Login, events.FieldServerID: node.UUID, events.FieldReason: reason,
		}})
		return trace.AccessDenied("%s; the session is refused", reason)
	}
	r := t.srv.cfg.WebSessions.Recorder
	if r == nil {
		if required {
			return refuse("this proxy does not record sessions")
		}
		rec.reason = "this proxy does not record sessions"
		return nil
	}
	set, err := r.Settings(ctx)
	if err != nil {
		t.log.WithError(err).Warn("Reading the recording settings failed.")
		if required {
			return refuse("the cluster's recording settings could not be read")
		}
		rec.reason = "the cluster's recording settings could not be read"
		return nil
	}
	switch {
	case required:
	case mode == services.RecordingExempt:
		rec.reason = fmt.Sprintf("exempt by role %q", role)
		return nil
	case set.Spec.SessionRecording == services.RecordingOff:
		rec.reason = "cluster session_recording is off"
		return nil
	}
	clock := t.srv.cfg.Clock
	w, err := recording.New(recording.Config{
		Header: recording.Header{
			Width: cols, Height: rows, Env: map[string]string{"TERM": termType},
			SessionID: t.id, User: t.live.user, Login: t.params.Login,
			Node: node.UUID, NodeHostname: node.Hostname, Cluster: cluster,
		},
		Sink:        &recording.SpoolSink{Storage: r.Spool, Session: t.id, Notify: r.Notify, Clock: clock},
		Deps:        observe.Deps{Clock: clock, Logger: t.log},
		MaxBytes:    set.Spec.MaxRecordingBytes,
		RecordInput: set.Spec.RecordInput,
		OnCap: func() {
			t.log.WithField("max_recording_bytes", set.Spec.MaxRecordingBytes).Warn("Recording reached its cap and stopped; the session goes on.")
			t.srv.cfg.WebSessions.Audit.Emit(context.WithoutCancel(ctx), events.Event{Type: events.RecordingCapped, User: t.live.user, Fields: events.Fields{
				events.FieldSessionID: t.id, "max_recording_bytes": set.Spec.MaxRecordingBytes,
			}})
		},
		OnFail: func(err error) {
			t.log.WithError(err).Warn("Recording failed.")
			t.auditFailed(ctx, role)
			if required {
				// As on a node: a required recording that fails ends the
				// session.
				t.cancel(&sessionEnd{code: -1, err: fmt.Errorf("session recording is required by %s and %s; the session is ended", who, errProxyRecordingFailed), reason: "session recording failed"})
			}
		},
	})
	if err == nil {
		// The probe: the header is stored before the shell starts, so
		// that "recorded" means the spool took the first chunk.
		if err = w.Sync(); err != nil {
			_, _ = w.Close("")
		}
	}
	if err != nil {
		t.log.WithError(err).Warn("Starting the recording failed.")
		if required {
			return refuse("the recording could not be started")
		}
		rec.reason = "the recording could not be started"
		return nil
	}
	rec.w = w
	if required {
		rec.requiredBy = role
	}
	return nil
}

// termType is the terminal the web terminal asks the node for.
const termType = "xterm-256color"

// errProxyRecordingFailed is the reason of a proxy recording that failed
// after it started.
const errProxyRecordingFailed = "the recording could not be stored on the proxy (its spool is full or cannot be written)"

// newRecordingID is the id of a recorded terminal: a session id in the
// recordings' form, which is what psh play and the audit trail name.
func newRecordingID() string { return uuid.NewString() }

// abortRecording closes the recording of a terminal that never started
// (its shell was refused, the proxy is shutting down).
func (t *term) abortRecording() {
	if w := t.rec.w; w != nil {
		_, _ = w.Close("")
	}
}

// recordOutput records output p; false when a required recording has
// failed and p must not be shown.
func (t *term) recordOutput(p []byte) bool {
	w := t.rec.w
	if w == nil {
		return true
	}
	if t.rec.requiredBy != "" && w.Failed() {
		return false
	}
	w.Output(p)
	return true
}

func (t *term) recordInput(p []byte) {
	if w := t.rec.w; w != nil {
		w.Input(p)
	}
}

func (t *term) recordResize(cols, rows uint32) {
	if w := t.rec.w; w != nil {
		w.Resize(cols, rows)
	}
}

// emitStart records session.start for a terminal the proxy records (an
// OpenSSH node's: a Postern node records its own session.start), with
// recorded and, when not, why.
func (t *term) emitStart(ctx context.Context, node services.Node) {
	if !t.rec.decided {
		return
	}
	fields := events.Fields{
		events.FieldMethod:         auditMethod,
		events.FieldKind:           auditKind,
		events.FieldSessionID:      t.id,
		events.FieldTarget:         t.params.Host,
		events.FieldLogin:          t.params.Login,
		events.FieldRemoteAddr:     t.remoteAddr,
		events.FieldServerID:       node.UUID,
		events.FieldServerHostname: node.Hostname,
		events.FieldServerAddr:     node.Addr,
		"node_kind":                services.NodeKindOpenSSH,
		"pty":                      true,
		events.FieldRecorded:       t.rec.w != nil,
	}
	if t.rec.w == nil {
		fields[events.FieldRecordingReason] = t.rec.reason
	} else {
		fields["max_recording_bytes"] = t.rec.w.MaxBytes()
	}
	t.srv.cfg.WebSessions.Audit.Emit(ctx, events.Event{Type: events.SessionStart, User: t.live.user, Fields: fields})
}

// closeRecording ends the recording with the exit marker and notes in
// fields (session.end's) whether it was stored, as a node does.
func (t *term) closeRecording(end *sessionEnd, fields events.Fields) {
	if !t.rec.decided {
		return
	}
	w := t.rec.w
	if w == nil {
		fields[events.FieldRecorded] = false
		fields[events.FieldRecordingReason] = t.rec.reason
		return
	}
	label := "exit-status -1"
	if end.code >= 0 {
		label = fmt.Sprintf("exit-status %d", end.code)
	}
	final, err := w.Close(label)
	if err != nil {
		t.log.WithError(err).Warn("Recording is incomplete: a chunk could not be stored.")
		t.auditFailed(t.srv.web.ctx, t.rec.requiredBy)
		fields[events.FieldRecorded] = false
		fields[events.FieldRecordingReason] = errProxyRecordingFailed
		return
	}
	fields[events.FieldRecorded] = true
	fields[events.FieldRecordingHash] = final
}
