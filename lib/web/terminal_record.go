package web

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/recording/recpolicy"
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
	// OpenSSH node); d is the decision (why it is not recorded, who
	// requires it).
	decided bool
	d       recpolicy.Decision
	w       *recording.Writer
	// requiredBy names the role that requires the recording: output the
	// recording did not take is not shown, and the terminal ends.
	requiredBy string
	// subject is the terminal as its recording events name it.
	subject recpolicy.Subject
	// failOnce emits recording.failed once per terminal.
	failOnce sync.Once
}

// auditFailed emits recording.failed once, as a node does for its
// sessions (the same fields: recpolicy.FailedFields).
func (t *term) auditFailed(ctx context.Context, role string) {
	t.rec.failOnce.Do(func() {
		t.srv.cfg.WebSessions.Audit.Emit(context.WithoutCancel(ctx), events.Event{Type: events.RecordingFailed, User: t.live.user, Fields: recpolicy.FailedFields(t.rec.subject, recpolicy.Proxy, role)})
	})
}

// startRecording decides, with the node's decision (recpolicy.Decide),
// whether the terminal to OpenSSH node is recorded, and starts its
// recording. It runs before the shell starts, so that nothing is typed
// that is not recorded.
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
	rec.subject = recpolicy.Subject{
		Method: auditMethod, Kind: auditKind, SessionID: t.id, Target: t.params.Host,
		Login: t.params.Login, RemoteAddr: t.remoteAddr, ServerID: node.UUID, ServerHostname: node.Hostname,
	}
	in := recpolicy.Input{Recorder: recpolicy.Proxy, LeafRequiredBy: leafRequiredBy, LeafCluster: cluster}
	if id.Checker != nil {
		in.Mode, in.Role = id.Checker.RecordingPolicy()
	}
	r := t.srv.cfg.WebSessions.Recorder
	if r != nil {
		in.Settings = r.Settings
	}
	d := recpolicy.Decide(ctx, in)
	if d.SettingsErr != nil {
		t.log.WithError(d.SettingsErr).Warn("Reading the recording settings failed.")
	}
	if !d.Record {
		return t.decided(ctx, d)
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
		MaxBytes:    d.MaxBytes(),
		RecordInput: d.RecordInput(),
		OnCap: func() {
			t.log.WithField("max_recording_bytes", d.MaxBytes()).Warn("Recording reached its cap and stopped; the session goes on.")
			t.srv.cfg.WebSessions.Audit.Emit(context.WithoutCancel(ctx), events.Event{Type: events.RecordingCapped, User: t.live.user, Fields: recpolicy.CappedFields(rec.subject, d.MaxBytes())})
		},
		OnFail: func(err error) {
			t.log.WithError(err).Warn("Recording failed.")
			t.auditFailed(ctx, d.RequiredBy)
			if d.RequiredBy != "" {
				// As on a node: a required recording that fails ends the
				// session.
				t.cancel(&sessionEnd{code: -1, err: errors.New(d.EndedMessage()), reason: "session recording failed"})
			}
		},
	})
	if err != nil {
		t.log.WithError(err).Warn("Starting the recording failed.")
		return t.decided(ctx, d.StartFailed(recpolicy.ReasonNotStarted))
	}
	// The probe: the header is stored before the shell starts, so that
	// "recorded" means the spool took the first chunk.
	if err := w.Sync(); err != nil {
		_, _ = w.Close("")
		t.log.WithError(err).Warn("The recording spool cannot be written.")
		return t.decided(ctx, d.StartFailed(recpolicy.ReasonSpoolUnwritable(recpolicy.Proxy)))
	}
	rec.w, rec.d, rec.requiredBy = w, d, d.RequiredBy
	return nil
}

// decided notes a terminal that is not recorded, and refuses it (audited
// as access.denied, with the node's fields) when a role requires the
// recording.
func (t *term) decided(ctx context.Context, d recpolicy.Decision) error {
	t.rec.d = d
	if d.Refused {
		t.srv.cfg.WebSessions.Audit.Emit(ctx, events.Event{Type: events.AccessDenied, User: t.live.user, Fields: recpolicy.RefusedFields(t.rec.subject, d)})
		return d.Err()
	}
	return nil
}

// termType is the terminal the web terminal asks the node for.
const termType = "xterm-256color"

// errProxyRecordingFailed is the reason of a proxy recording that failed
// after it started.
var errProxyRecordingFailed = recpolicy.ReasonFailed(recpolicy.Proxy)

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
	}
	var maxBytes int64
	if t.rec.w != nil {
		maxBytes = t.rec.w.MaxBytes()
	}
	recpolicy.AddStartFields(fields, t.rec.d, maxBytes)
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
		fields[events.FieldRecordingReason] = t.rec.d.Reason
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
