// Package recpolicy decides whether a session is recorded, and writes the
// reasons and audit fields of that decision, for every door that records:
// a Postern node records its own sessions (lib/srv) and the proxy records
// its web terminals to OpenSSH nodes (lib/web). Both used to carry their
// own copy of the decision, and the copies drifted (different reasons for
// the same spool failure, recording.failed with different fields); one
// function here means a rule changed for one door is changed for both.
//
// It imports neither lib/srv nor lib/web (TestLeaf): the doors call it,
// not the other way round.
package recpolicy

import (
	"context"
	"fmt"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// The recorders: who makes the recording, named in the reasons so that
// an auditor reads which spool or configuration to look at.
const (
	Node  = "node"
	Proxy = "proxy"
)

// FieldRequiredBy names the role that requires a recording.
const FieldRequiredBy = "required_by"

// FieldMaxRecordingBytes is the cap of a recording (session.start,
// recording.capped).
const FieldMaxRecordingBytes = "max_recording_bytes"

// Reasons a session is not recorded, or refused when a role requires it.
// The ones naming the recorder are functions of it.
const (
	ReasonSettingsUnreadable = "the cluster's recording settings could not be read"
	ReasonOff                = "cluster session_recording is off"
	ReasonNotStarted         = "the recording could not be started"
)

// ReasonNoRecorder is why a session is not recorded by a recorder that is
// not configured to record.
func ReasonNoRecorder(recorder string) string {
	return "this " + recorder + " does not record sessions"
}

// ReasonSpoolUnwritable is why a session is not recorded when its
// recording's first chunk cannot be stored (the probe); the log has the
// cause.
func ReasonSpoolUnwritable(recorder string) string {
	return "the " + recorder + "'s recording spool cannot be written"
}

// ReasonFailed is the reason of a recording that failed after it started.
func ReasonFailed(recorder string) string {
	return "the recording could not be stored on the " + recorder + " (its spool is full or cannot be written)"
}

// ReasonExempt is why a session exempted by role is not recorded.
func ReasonExempt(role string) string { return fmt.Sprintf("exempt by role %q", role) }

// Input is what the decision depends on.
type Input struct {
	// Recorder is Node or Proxy.
	Recorder string
	// Settings reads the cluster's recording settings; nil means this
	// recorder does not record (no spool configured).
	Settings func(ctx context.Context) (*services.ClusterNetworkingConfig, error)
	// Mode and Role are the user's roles' RecordingPolicy.
	Mode, Role string
	// LeafRequiredBy names a leaf cluster's role (LeafCluster's) that
	// requires the recording of a session to one of its OpenSSH nodes,
	// which the root proxy records: honoured on top of the user's roles.
	LeafRequiredBy, LeafCluster string
}

// Decision is whether a session is recorded.
type Decision struct {
	// Record: start the recording (with Settings' cap and record_input).
	Record bool
	// Refused: a role requires the recording and it cannot be made; the
	// session must not start. Reason says why it cannot.
	Refused bool
	// Reason is why the session is not recorded (or is refused).
	Reason string
	// RequiredBy is the role requiring the recording, "" when none does;
	// who names it in messages ("role \"x\"", or with its leaf cluster).
	RequiredBy string
	who        string
	// Settings are the cluster's settings as read (nil when they were
	// not), SettingsErr the error reading them, for the door's log.
	Settings    *services.ClusterNetworkingConfig
	SettingsErr error
	recorder    string
}

// Decide is the decision, in this order: the user's roles may require the
// recording (recorded whatever the cluster says, or the session refused:
// whoever wrote the role chose an audit trail over access, deny by
// default); otherwise a recorder that does not record or settings that
// cannot be read leave the session unrecorded (recording never costs the
// user their session), an exempting role or the cluster's off too.
func Decide(ctx context.Context, in Input) Decision {
	d := Decision{recorder: in.Recorder}
	if in.Mode == services.RecordingRequire {
		d.RequiredBy, d.who = in.Role, fmt.Sprintf("role %q", in.Role)
	} else if in.LeafRequiredBy != "" {
		d.RequiredBy, d.who = in.LeafRequiredBy, fmt.Sprintf("role %q of cluster %q", in.LeafRequiredBy, in.LeafCluster)
	}
	if in.Settings == nil {
		return d.notRecorded(ReasonNoRecorder(in.Recorder))
	}
	d.Settings, d.SettingsErr = in.Settings(ctx)
	if d.SettingsErr != nil {
		d.Settings = nil
		return d.notRecorded(ReasonSettingsUnreadable)
	}
	switch {
	case d.RequiredBy != "":
	case in.Mode == services.RecordingExempt:
		return d.notRecorded(ReasonExempt(in.Role))
	case d.Settings.Spec.SessionRecording == services.RecordingOff:
		return d.notRecorded(ReasonOff)
	}
	d.Record = true
	return d
}

// notRecorded is d not recorded for reason: refused when a role requires
// the recording.
func (d Decision) notRecorded(reason string) Decision {
	d.Record, d.Reason, d.Refused = false, reason, d.RequiredBy != ""
	return d
}

// StartFailed is d once its recording could not be started (why is
// ReasonNotStarted or ReasonSpoolUnwritable).
func (d Decision) StartFailed(why string) Decision { return d.notRecorded(why) }

// RefusalReason is the audited reason of a refused session.
func (d Decision) RefusalReason() string {
	return fmt.Sprintf("session recording is required by %s and %s", d.who, d.Reason)
}

// Err is the error the user reads for a refused session.
func (d Decision) Err() error {
	return trace.AccessDenied("%s; the session is refused", d.RefusalReason())
}

// EndedMessage is what the user reads when a required recording fails
// mid-session and the session is ended.
func (d Decision) EndedMessage() string {
	return fmt.Sprintf("session recording is required by %s and %s; the session is ended", d.who, ReasonFailed(d.recorder))
}

// MaxBytes and RecordInput are the settings' cap and record_input.
func (d Decision) MaxBytes() int64 {
	if d.Settings == nil {
		return 0
	}
	return d.Settings.Spec.MaxRecordingBytes
}

// RecordInput reports whether the cluster records input.
func (d Decision) RecordInput() bool { return d.Settings != nil && d.Settings.Spec.RecordInput }

// Subject is the session a recording event is about, as each door knows
// it. Every recording event carries all of these fields, from both doors,
// so that one query finds a session's recording events whichever door
// recorded it (the node's also carry its connection's conn_id).
type Subject struct {
	// Method ("ssh", "web") and Kind ("session", "terminal") say which
	// door.
	Method, Kind string
	SessionID    string
	// Target is what the user asked for: the node's command, or the web
	// terminal's host.
	Target                   string
	Login, RemoteAddr        string
	ServerID, ServerHostname string
}

func (s Subject) fields() events.Fields {
	return events.Fields{
		events.FieldMethod:         s.Method,
		events.FieldKind:           s.Kind,
		events.FieldSessionID:      s.SessionID,
		events.FieldTarget:         s.Target,
		events.FieldLogin:          s.Login,
		events.FieldRemoteAddr:     s.RemoteAddr,
		events.FieldServerID:       s.ServerID,
		events.FieldServerHostname: s.ServerHostname,
	}
}

// RefusedFields are the fields of the access.denied of a refused session.
func RefusedFields(s Subject, d Decision) events.Fields {
	f := s.fields()
	f[events.FieldReason] = d.RefusalReason()
	f[FieldRequiredBy] = d.RequiredBy
	return f
}

// FailedFields are recording.failed's: a recording that failed after it
// started; requiredBy is the role requiring it ("" when none: the field
// is then absent).
func FailedFields(s Subject, recorder, requiredBy string) events.Fields {
	f := s.fields()
	f[events.FieldReason] = ReasonFailed(recorder)
	if requiredBy != "" {
		f[FieldRequiredBy] = requiredBy
	}
	return f
}

// CappedFields are recording.capped's.
func CappedFields(s Subject, maxBytes int64) events.Fields {
	f := s.fields()
	f[FieldMaxRecordingBytes] = maxBytes
	return f
}

// AddStartFields adds to session.start's fields whether the session is
// recorded: recorded, and recording_reason when not, or the cap in
// effect (the writer's, maxBytes) and required_by when it is.
func AddStartFields(f events.Fields, d Decision, maxBytes int64) {
	f[events.FieldRecorded] = d.Record
	if !d.Record {
		f[events.FieldRecordingReason] = d.Reason
		return
	}
	f[FieldMaxRecordingBytes] = maxBytes
	if d.RequiredBy != "" {
		f[FieldRequiredBy] = d.RequiredBy
	}
}
