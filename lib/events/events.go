// Package events is Postern's audit log: what happened, to whom, when,
// written as one JSON object per line to DATA_DIR/log/events.log and, when
// the process runs the auth role, into the backend under /events/ (where
// `pctl events ls` finds them through Search). A process without the auth
// role (a joined node, a separate proxy) has no backend: it ships its
// events in batches to auth (Config.Remote, POST /v1/events), which stamps
// them with what it can vouch for (ShippedEvent: its cluster name, the
// shipping host's UUID from its certificate) and stores them like its own.
//
// Producers (lib/srv, lib/web, lib/auth) depend only on the narrow Emitter
// interface; Emit never blocks and never fails the caller: auditing a
// session must not be the thing that stalls it. Events are queued and
// written by one goroutine per sink, so a slow disk or an unreachable
// backend delays the log, not the session. The file is written first and
// is the write-ahead log of the backend and of shipping: they follow it,
// retrying until each event is stored, across restarts (wal.go), and
// postern_audit_pending counts what they have yet to store. When the
// file's own queue is full the event is dropped, counted in
// postern_audit_dropped_total and logged.
//
// A session is followed through its session_id: session.start,
// port.forward, agent.forward and session.end of one session carry the same
// id, and session.end and port.forward carry bytes_in (client to server)
// and bytes_out (server to client).
package events

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gravitational/trace"
)

// Event types (docs/reference.md, Audit events).
const (
	// AuthLogin: a successful login (web, psh login, certificate issued).
	AuthLogin = "auth.login"
	// AuthFailed: a failed login (wrong password or OTP, unknown user,
	// rate limited).
	AuthFailed = "auth.failed"
	// MFAAdd: a user registered a second factor (device, kind).
	MFAAdd = "mfa.add"
	// MFADelete: a user removed one of their second factors.
	MFADelete = "mfa.delete"
	// MFAReset: an admin removed every second factor of target_user
	// (`pctl users reset-mfa`).
	MFAReset = "mfa.reset"
	// MFACloneWarning: a passkey answered with a signature counter not
	// above the last one seen (a cloned authenticator, or a replay); the
	// login was refused.
	MFACloneWarning = "mfa.clone_warning"
	// SessionStart: an SSH session (shell, exec, sftp, proxy subsystem or
	// web terminal) began.
	SessionStart = "session.start"
	// SessionEnd: it ended; carries bytes_in, bytes_out and exit_code when
	// there is one.
	SessionEnd = "session.end"
	// AccessDenied: an authenticated request refused by RBAC or a cap, or
	// a certificate refused (expired, wrong CA, login not allowed).
	AccessDenied = "access.denied"
	// RouteAmbiguous: a target matched several nodes.
	RouteAmbiguous = "route.ambiguous"
	// RouteLeaf: a root proxy routed a connection (or a node listing)
	// to a leaf cluster, which accepted it: the root's record of who
	// went where (remote_cluster, target, kind); the leaf audits the
	// session itself. A refusal is an access.denied naming the cluster.
	RouteLeaf = "route.leaf"
	// PortForward: a -L/-R/direct-tcpip forward connection, emitted when it
	// ends with its byte counts.
	PortForward = "port.forward"
	// AgentForward: a connection to the forwarded agent socket.
	AgentForward = "agent.forward"
	// ConnRefused: a connection refused before any handshake, by a cap on
	// its source address or the listener's total, or by the per-address
	// rate of new connections. Emitted at most once per source address
	// and cap per ConnRefusedInterval, with the number refused meanwhile
	// in FieldCount, so that a flood cannot flood the audit log too.
	ConnRefused = "conn.refused"
	// ConnTerminated: the server ended an open connection because what
	// authenticated it stopped being trusted (a root's user after
	// `pctl rm trusted_cluster/ROOT` on this leaf, or the root's user CA
	// removed); FieldReason says which.
	ConnTerminated = "conn.terminated"
	// HostJoin: a host joined the cluster with a token (auth emits it).
	HostJoin = "host.join"
	// HostJoinFailed: a join was refused (bad or spent token, wrong
	// role, rate limited, invalid request).
	HostJoinFailed = "host.join.failed"
	// LeafAdd: a leaf cluster spent a trusted_cluster token on this
	// (root) cluster and its CAs were stored; LeafAddFailed: such an
	// attempt was refused (the reason says why: spent token, a name
	// taken by the root or by another leaf, malformed CA keys).
	LeafAdd       = "remote_cluster.add"
	LeafAddFailed = "remote_cluster.add.failed"
	// LeafRemove: an admin removed a leaf (pctl clusters rm) and its CAs.
	LeafRemove = "remote_cluster.remove"
	// TrustAdd and TrustRemove: on a leaf, trust in a root established
	// (pctl create -f trusted_cluster.yaml) or withdrawn (pctl rm).
	TrustAdd    = "trusted_cluster.add"
	TrustRemove = "trusted_cluster.remove"
	// APIDenied: a host's auth API call refused: an endpoint its role may
	// not call, or a write outside what its identity may touch (a node
	// announcing another node).
	APIDenied = "api.denied"
	// RecordingCapped: a session's recording reached max_recording_bytes
	// and stopped; the session went on.
	RecordingCapped = "recording.capped"
	// RecordingFailed: a session's recording could not be stored (the
	// node's spool is full or cannot be written) after it started; the
	// reason says why. A session whose role requires recording is ended
	// with it; any other session goes on unrecorded.
	RecordingFailed = "recording.failed"
	// RecordingPlay: someone read a recording (playback or export).
	RecordingPlay = "recording.play"
	// RecordingDeleted: retention (recordings.retention) deleted a
	// recording; reason says which setting.
	RecordingDeleted = "recording.deleted"
	// BackupCreate: an admin read a backup of the backend (pctl backup);
	// it holds the CAs' private keys. count is the items sent; reason,
	// when set, says why the backup failed.
	BackupCreate = "backup.create"
	// NodeCreate: an admin registered an OpenSSH server (pctl nodes
	// add-openssh) and auth signed its host certificate; NodeRotate: an
	// admin had that certificate reissued (pctl nodes rotate-openssh).
	// Both name the node (server_id, server_hostname, server_addr) and
	// the key certified (fingerprint).
	NodeCreate = "node.create"
	NodeRotate = "node.rotate"
	// AccessRequestCreate, AccessRequestReview and AccessRequestExpire
	// are the steps of an access request (psh request create, a review
	// by psh/pctl/the web UI, auth's expiry sweep): request_id, roles,
	// requester, state (after the step), reason, review (approved or
	// denied).
	AccessRequestCreate = "access_request.create"
	AccessRequestReview = "access_request.review"
	AccessRequestExpire = "access_request.expire"
)

// Field names, snake_case like the log keys. Use these
// rather than new names for the same thing, so that one query finds them.
const (
	FieldSessionID  = "session_id"
	FieldConnID     = "conn_id"
	FieldLogin      = "login"
	FieldRemoteAddr = "remote_addr"
	FieldLocalAddr  = "local_addr"
	// FieldServerID is the node's uuid, FieldServerHostname its hostname
	// and FieldServerAddr its SSH address.
	FieldServerID       = "server_id"
	FieldServerHostname = "server_hostname"
	FieldServerAddr     = "server_addr"
	// FieldTarget is what the user asked for ("host:port@cluster").
	FieldTarget = "target"
	// FieldBytesIn counts bytes from the client into the session or
	// forward, FieldBytesOut bytes from it back to the client.
	FieldBytesIn  = "bytes_in"
	FieldBytesOut = "bytes_out"
	// FieldReason says why something was refused or ended.
	FieldReason = "reason"
	// FieldMethod is how a user came in: "ssh", "web", "psh", "api".
	FieldMethod = "method"
	// FieldConnector is the SSO connector a login came through;
	// FieldClaims, on a refused SSO login, the identity provider's claims
	// the role mapping looked at (names and values).
	FieldConnector = "connector"
	FieldClaims    = "claims"
	// FieldKind is a sub-kind: "shell", "exec", "sftp", "proxy", "-L", "-R".
	FieldKind     = "kind"
	FieldCommand  = "command"
	FieldExitCode = "exit_code"
	// FieldRecordingHash is the final hash of a session's recording
	// (lib/recording), in session.end.
	FieldRecordingHash = "recording_hash"
	// FieldRecorded says in session.start whether the session is recorded;
	// FieldRecordingReason says why not ("exempt by role \"ops\"", "cluster
	// session_recording is off", ...).
	FieldRecorded        = "recorded"
	FieldRecordingReason = "recording_reason"
	// FieldAddr is a forwarded address ("db:5432").
	FieldAddr       = "addr"
	FieldCandidates = "candidates"
	FieldRoles      = "roles"
	// FieldRole is a host's role ("node", "proxy") in join and API events.
	FieldRole = "role"
	// FieldHostname is the hostname a joining host asked for.
	FieldHostname = "hostname"
	// FieldEndpoint is an auth API endpoint ("PUT /v1/nodes").
	FieldEndpoint = "endpoint"
	// FieldRemoteCluster names the other cluster of a trust relation.
	FieldRemoteCluster = "remote_cluster"
	// FieldUserCluster is, in a leaf cluster's events, the root cluster
	// whose certificate the user came with, and FieldRemoteRoles the
	// root roles it named (FieldRoles: the leaf roles they mapped to).
	FieldUserCluster = "user_cluster"
	FieldRemoteRoles = "remote_roles"
	// FieldListener names the listener that refused a connection
	// ("proxy_ssh", "web", "node"), FieldCap the cap that did
	// (lib/limiter's cap names) and FieldCount how many were refused.
	FieldListener = "listener"
	FieldCap      = "cap"
	FieldCount    = "count"
	// FieldEmitterID is the UUID, from its client certificate, of the
	// host that shipped an event to auth, and FieldEmitterRole its role:
	// set by auth, never taken from the event (see ShippedEvent).
	FieldEmitterID   = "emitter_id"
	FieldEmitterRole = "emitter_role"
	// FieldFingerprint is an SSH key's SHA256 fingerprint.
	FieldFingerprint = "fingerprint"
	// FieldRequestID names an access request.
	FieldRequestID = "request_id"
)

// Fields are an event's own fields, beside the common ones.
type Fields = map[string]any

// Event is one audit record. In JSON the common keys come first and Fields
// are flattened beside them:
//
//	{"event":"session.start","time":"2026-11-30T13:00:00Z","id":"...",
//	 "user":"alice","cluster":"example","login":"root","session_id":"..."}
type Event struct {
	// Type is one of the constants above.
	Type string
	// Time is when it happened; zero means now (the Emitter's Clock).
	Time time.Time
	// ID identifies the record; empty means a new random one.
	ID string
	// User is the Postern user (not the OS login), empty when unknown.
	User string
	// Cluster; empty means the Emitter's cluster.
	Cluster string
	// Fields hold the rest. Keys named like a common key are ignored.
	Fields Fields
}

// Common JSON keys.
const (
	keyEvent   = "event"
	keyTime    = "time"
	keyID      = "id"
	keyUser    = "user"
	keyCluster = "cluster"
)

func reserved(k string) bool {
	switch k {
	case keyEvent, keyTime, keyID, keyUser, keyCluster:
		return true
	}
	return false
}

// maxStringField bounds one string value. Much of what is audited comes
// from the client (a requested target, a login name, a command), and a
// megabyte in a subsystem request must not become a megabyte in every copy
// of the log. 4 KiB keeps any real command line or target whole.
const maxStringField = 4096

// MarshalJSON writes the common keys first, then the fields sorted by
// name. A value that cannot be encoded is written as its %v text rather
// than failing the event. encoding/json escapes control characters, so a
// value with a newline cannot forge a second log line.
func (e Event) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	writeKV := func(k string, v any) {
		if buf.Len() > 1 {
			buf.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		buf.Write(kb)
		buf.WriteByte(':')
		if s, ok := v.(string); ok && len(s) > maxStringField {
			v = truncate(s)
		}
		vb, err := json.Marshal(v)
		if err != nil {
			vb, _ = json.Marshal(fmt.Sprintf("%v", v))
		}
		buf.Write(vb)
	}
	writeKV(keyEvent, e.Type)
	writeKV(keyTime, e.Time.UTC().Format(time.RFC3339Nano))
	if e.ID != "" {
		writeKV(keyID, e.ID)
	}
	writeKV(keyUser, e.User)
	writeKV(keyCluster, e.Cluster)
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		if !reserved(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		writeKV(k, e.Fields[k])
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

func truncate(s string) string {
	s = s[:maxStringField]
	for !utf8.ValidString(s) && len(s) > 0 {
		s = s[:len(s)-1]
	}
	return s + "...(truncated)"
}

// UnmarshalJSON reads what MarshalJSON wrote. Numbers in Fields come back
// as json.Number, so byte counts print as integers.
func (e *Event) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return trace.BadParameter("malformed audit event: %v", err)
	}
	str := func(k string) string {
		s, _ := m[k].(string)
		delete(m, k)
		return s
	}
	*e = Event{Type: str(keyEvent), ID: str(keyID), User: str(keyUser), Cluster: str(keyCluster)}
	if t := str(keyTime); t != "" {
		tm, err := time.Parse(time.RFC3339Nano, t)
		if err != nil {
			return trace.BadParameter("malformed audit event time %q", t)
		}
		e.Time = tm
	}
	if len(m) > 0 {
		e.Fields = m
	}
	return nil
}

// Emitter is what producers need. Emit must not block on I/O and has no
// error to handle: failures are the emitter's to log and count.
type Emitter interface {
	Emit(ctx context.Context, e Event)
}

// Discard drops every event (tests and tools that audit nothing).
var Discard Emitter = discard{}

type discard struct{}

func (discard) Emit(context.Context, Event) {}

// Recorder keeps events in memory, for tests that assert what was audited.
type Recorder struct {
	// mu guards events and changed.
	mu     sync.Mutex
	events []Event
	// changed is closed and replaced at every Emit, waking Wait.
	changed chan struct{}
}

var (
	_ Emitter = (*Recorder)(nil)
	_ Emitter = (*Log)(nil)
)

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{changed: make(chan struct{})} }

// Emit records e.
func (r *Recorder) Emit(_ context.Context, e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Events returns a copy of what was recorded, in order.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// Wait returns the first recorded event of eventType for which match (nil
// matches all) is true, waiting for it until ctx is done.
func (r *Recorder) Wait(ctx context.Context, eventType string, match func(Event) bool) (Event, error) {
	for {
		r.mu.Lock()
		for _, e := range r.events {
			if e.Type == eventType && (match == nil || match(e)) {
				r.mu.Unlock()
				return e, nil
			}
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return Event{}, trace.Wrap(ctx.Err(), "waiting for a %s event", eventType)
		}
	}
}
