// Package recpolicytest is the one table of recording decisions that both
// doors' tests run through their own callers (lib/srv for a node's
// sessions, lib/web for the proxy's web terminals to OpenSSH nodes): the
// wanted decisions and event fields are written here once, as literals,
// so a door whose caller decides differently, or emits other fields,
// fails its test.
package recpolicytest

import (
	"errors"
	"sort"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// Role is the name of the role the cases give the user on top of one that
// lets them in; its session_recording is the case's RoleMode.
const Role = "recpolicy"

// ErrSettings is what a case's unreadable settings return.
var ErrSettings = errors.New("auth server unreachable")

// Case is one decision.
type Case struct {
	Name string
	// ClusterMode is the cluster's session_recording; SettingsErr makes
	// the settings unreadable instead.
	ClusterMode string
	SettingsErr bool
	// RoleMode is Role's session_recording ("", require, exempt).
	RoleMode string

	// Recorded: session.start says recorded. Refused: the session is
	// refused (access.denied). Reason is recording_reason, or the
	// refusal's reason.
	Recorded, Refused bool
	Reason            string
}

// Cases cover off, require, exempt and a settings error, each with and
// without a role requiring the recording.
var Cases = []Case{
	{Name: "cluster records", ClusterMode: services.RecordingNode, Recorded: true},
	{Name: "cluster off", ClusterMode: services.RecordingOff, Reason: "cluster session_recording is off"},
	{Name: "require beats off", ClusterMode: services.RecordingOff, RoleMode: services.RecordingRequire, Recorded: true},
	{Name: "exempt", ClusterMode: services.RecordingNode, RoleMode: services.RecordingExempt, Reason: `exempt by role "recpolicy"`},
	{Name: "settings error", SettingsErr: true, Reason: "the cluster's recording settings could not be read"},
	{Name: "settings error, required", SettingsErr: true, RoleMode: services.RecordingRequire, Refused: true,
		Reason: `session recording is required by role "recpolicy" and the cluster's recording settings could not be read`},
}

// Settings is the case's cluster settings, or ErrSettings.
func (c Case) Settings() (*services.ClusterNetworkingConfig, error) {
	if c.SettingsErr {
		return nil, ErrSettings
	}
	cfg := &services.ClusterNetworkingConfig{Spec: services.ClusterNetworkingConfigSpec{SessionRecording: c.ClusterMode}}
	return cfg, cfg.CheckAndSetDefaults()
}

// RequiredBy is the role that requires the recording in this case.
func (c Case) RequiredBy() string {
	if c.RoleMode == services.RecordingRequire {
		return Role
	}
	return ""
}

// StartFields are the recording fields session.start carries in this
// case, with their values (max_recording_bytes: the default cap).
func (c Case) StartFields() events.Fields {
	f := events.Fields{events.FieldRecorded: c.Recorded}
	if !c.Recorded {
		f[events.FieldRecordingReason] = c.Reason
		return f
	}
	f["max_recording_bytes"] = int64(services.DefaultMaxRecordingBytes)
	if r := c.RequiredBy(); r != "" {
		f["required_by"] = r
	}
	return f
}

// RecordingStartKeys are the keys StartFields may hold.
var RecordingStartKeys = []string{events.FieldRecorded, events.FieldRecordingReason, "max_recording_bytes", "required_by"}

// RefusedKeys are the fields of the access.denied of a refused session,
// from either door (a node's also carries its connection's conn_id).
var RefusedKeys = []string{
	events.FieldMethod, events.FieldKind, events.FieldSessionID, events.FieldTarget, events.FieldLogin,
	events.FieldRemoteAddr, events.FieldServerID, events.FieldServerHostname, events.FieldReason, "required_by",
}

// Keys are f's keys, sorted, without those in drop.
func Keys(f events.Fields, drop ...string) []string {
	var out []string
	for k := range f {
		skip := false
		for _, d := range drop {
			skip = skip || k == d
		}
		if !skip {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// Sorted is keys sorted (a copy).
func Sorted(keys []string) []string {
	out := append([]string(nil), keys...)
	sort.Strings(out)
	return out
}

// Pick is f restricted to keys.
func Pick(f events.Fields, keys []string) events.Fields {
	out := events.Fields{}
	for _, k := range keys {
		if v, ok := f[k]; ok {
			out[k] = v
		}
	}
	return out
}
