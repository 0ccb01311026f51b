// Package proxyapi holds what the proxy's SSH port answers besides
// forwarding: the subsystems psh (and OpenSSH users) open on it and the
// JSON they return. See package api for why it imports nothing of the
// servers.
package proxyapi

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/gravitational/trace"
)

// SubsystemNodes is the subsystem that lists the nodes the caller may
// reach (what `psh ls` reads): a JSON array of NodeEntry, then the channel
// closes. It exists because the proxy port is the one place psh already
// authenticates with its certificate; the web listing needs a session.
const SubsystemNodes = "nodes"

// SubsystemSites is the subsystem that lists clusters: a JSON array of
// Site.
const SubsystemSites = "proxysites"

// NodeEntry is one node of the `nodes` subsystem's answer (and of
// GET /webapi/nodes).
type NodeEntry struct {
	UUID     string            `json:"uuid"`
	Hostname string            `json:"hostname"`
	Addr     string            `json:"addr"`
	Labels   map[string]string `json:"labels,omitempty"`
	Cluster  string            `json:"cluster"`
	// Tunnel marks a node behind NAT, reached over its reverse tunnel
	// only (Addr is empty): the listings say so instead of showing a
	// blank address.
	Tunnel bool `json:"tunnel,omitempty"`
	// Logins are the certificate's logins the caller's roles allow on
	// this node.
	Logins []string `json:"logins"`
	// Kind is "openssh" for a stock sshd registered with `pctl nodes
	// add-openssh` (empty for a Postern node).
	Kind string `json:"kind,omitempty"`
	// Status is an OpenSSH node's health as the answering proxy's
	// checker finds it, NodeOnline or NodeOffline (empty for a Postern
	// node, which is listed only while it heartbeats).
	Status string `json:"status,omitempty"`
}

// Statuses of an OpenSSH node in NodeEntry.Status.
const (
	NodeOnline  = "online"
	NodeOffline = "offline"
)

// Site is one entry of the `proxysites` answer.
type Site struct {
	Name          string    `json:"name"`
	Status        string    `json:"status"`
	LastConnected time.Time `json:"last_connected"`
}

// SiteOnline is the status of a reachable cluster; SiteOffline of a leaf
// cluster without a live tunnel (listed only to users it accepted).
const (
	SiteOnline  = "online"
	SiteOffline = "offline"
)

// SubsystemRecordings lists the session recordings the caller may see
// (`psh recordings ls`): a JSON array of RecordingEntry. Like
// SubsystemNodes it lives on the proxy port because psh authenticates
// there with its certificate.
const SubsystemRecordings = "recordings"

// SubsystemRecordingPrefix + a session id streams that recording as an
// asciicast v2 file (`psh play`). A recording the caller may not see is
// refused exactly like one that does not exist.
const SubsystemRecordingPrefix = "recording:"

// SubsystemRecordingChunksPrefix + a session id streams that recording's
// stored chunks, one JSON object (recording.Chunk: index, hash, final,
// data) a line, in index order, so that psh checks the hash chain itself
// before it plays (`psh play`). Access and auditing are those of
// SubsystemRecordingPrefix. An older proxy refuses it as an unknown
// subsystem; psh then says it could not verify.
const SubsystemRecordingChunksPrefix = "recording-chunks:"

// RecordingEntry is one recording of the SubsystemRecordings answer.
type RecordingEntry struct {
	SessionID string    `json:"session_id"`
	Started   time.Time `json:"started"`
	User      string    `json:"user"`
	Login     string    `json:"login"`
	Node      string    `json:"node"`
	Command   string    `json:"command,omitempty"`
	Complete  bool      `json:"complete"`
}

// LeafRequest opens a root proxy's connection to a node of a leaf
// cluster: the first line (JSON, then "\n") on a transport channel of the
// leaf's tunnel. The leaf's proxy answers one LeafReply line; after an
// empty one the channel carries the node's SSH bytes.
type LeafRequest struct {
	// Target is HOST[:PORT] as the user wrote it for the leaf (routing
	// rules 1-6 run in the leaf, with its inventory and strategy).
	Target string `json:"target"`
	// Cert is the user's certificate (authorized_keys format) from the
	// root: the leaf decides from it, mapped through its role_map, which
	// nodes the user may reach.
	Cert string `json:"cert"`
	// Source is the client's address, for the leaf's audit log.
	Source string `json:"source,omitempty"`
	// Kind is what the root asks: LeafKindDial (also when empty) routes
	// Target and splices; LeafKindNodes answers the nodes the user may
	// see in the leaf (LeafReply.Nodes); LeafKindAccess only says whether
	// the user's roles map to anything there (empty reply, or denied),
	// so the root lists a leaf only to users who may reach it;
	// LeafKindRoute explains how the leaf's Router would route Target
	// for the user, among the nodes the user may see there only
	// (LeafReply.Explanation).
	Kind string `json:"kind,omitempty"`
}

// Kinds of LeafRequest.
const (
	LeafKindDial   = "dial"
	LeafKindNodes  = "nodes"
	LeafKindAccess = "access"
	LeafKindRoute  = "route"
)

// SubsystemRoutePrefix + HOST[:PORT][@CLUSTER] explains, as text, how the
// proxy would route that target for the caller (`pctl route --cluster
// LEAF --user NAME`): the candidates and the choice among the nodes the
// caller may see only, and for a leaf cluster the leaf's own explanation
// (its Router, inventory and routing_strategy, its RBAC for the caller's
// mapped roles). It dials nothing. A cluster that is unknown or refuses
// the caller is refused like `proxy:`: `cluster "X" not found`. The
// grammar is the proxy subsystem's (a port is required with @CLUSTER; 0
// means any). Exit status 1 when the route would fail.
const SubsystemRoutePrefix = "route:"

// MaxLeafExplanation bounds LeafReply.Explanation: the leaf cuts a longer
// one (a host matching thousands of nodes) and says so.
const MaxLeafExplanation = 256 << 10

// SubsystemNodesForCluster is SubsystemNodes for another cluster than the
// proxy's own: "nodes@CLUSTER".
const SubsystemNodesForCluster = SubsystemNodes + "@"

// LeafReply is the leaf proxy's answer to a LeafRequest: empty on
// success, else the message the user may be shown (a node the user may
// not reach reads like one that does not exist) and its kind.
type LeafReply struct {
	Error string `json:"error,omitempty"`
	Kind  string `json:"kind,omitempty"`
	// Nodes answers a LeafKindNodes request: the nodes the user may see
	// in the leaf, with their Cluster the leaf's name.
	Nodes []NodeEntry `json:"nodes,omitempty"`
	// Explanation answers a LeafKindRoute request: the leaf's routing
	// explanation as text (at most MaxLeafExplanation bytes), and
	// RouteFailed when that route would fail there (not found,
	// ambiguous).
	Explanation string `json:"explanation,omitempty"`
	RouteFailed bool   `json:"route_failed,omitempty"`
	// OpenSSH is set on the answer to a LeafKindDial request that the
	// leaf routed to one of its OpenSSH nodes (no Postern process there
	// records anything): the root proxy's web terminal, the session's SSH
	// client, then records it. Unset for a Postern node, which records
	// its own sessions. An older root ignores it.
	OpenSSH *LeafOpenSSHNode `json:"openssh,omitempty"`
}

// LeafOpenSSHNode is the OpenSSH node a leaf routed a dial to, as the
// root's recording of a web terminal to it names it.
type LeafOpenSSHNode struct {
	UUID     string `json:"uuid"`
	Hostname string `json:"hostname"`
	// RecordingRequiredBy names the leaf role (of those the user's roles
	// map to there) whose session_recording is require: the root then
	// records the terminal whatever its own settings say, and refuses it
	// when it cannot.
	RecordingRequiredBy string `json:"recording_required_by,omitempty"`
	// Cert is the leaf's certificate for the root user's key naming the
	// logins the mapped roles allow there (the sshd trusts the leaf's
	// user CA only, and enforces principals); CertError says why there
	// is none.
	Cert      string `json:"cert,omitempty"`
	CertError string `json:"cert_error,omitempty"`
}

// MaxLeafReply bounds a LeafReply line (a node list) as the root reads it.
const MaxLeafReply = 32 << 20

// Kinds of LeafReply errors.
const (
	LeafNotFound    = "not_found"
	LeafAmbiguous   = "ambiguous"
	LeafDenied      = "denied"
	LeafUnavailable = "unavailable"
	LeafBadRequest  = "bad_request"
)

// MaxLeafRequest bounds a LeafRequest line: a certificate is under 2 KiB.
const MaxLeafRequest = 64 << 10

// SubsystemAccessRequestPrefix + a JSON AccessRequestOp is one access
// request operation of the caller (psh request, psh login --request-id):
// the proxy passes the caller's certificate to the auth server, which acts
// for the user it names. The answer is JSON (a request, a list of them, or
// an AccessRequestCertAnswer); a refusal is the subsystem's refusal with
// the reason on stderr.
const SubsystemAccessRequestPrefix = "access-request:"

// Access request operations (AccessRequestOp.Op).
const (
	AccessRequestOpCreate = "create"
	AccessRequestOpList   = "ls"
	AccessRequestOpShow   = "show"
	AccessRequestOpReview = "review"
	AccessRequestOpCert   = "cert"
)

// AccessRequestOp is one operation of SubsystemAccessRequestPrefix.
type AccessRequestOp struct {
	Op     string   `json:"op"`
	ID     string   `json:"id,omitempty"`
	Roles  []string `json:"roles,omitempty"`
	Reason string   `json:"reason,omitempty"`
	// TTL is a Go duration ("1h"); empty means the cap.
	TTL string `json:"ttl,omitempty"`
	// State is the review: "approved" or "denied".
	State string `json:"state,omitempty"`
	// PublicKey is the key to certify (op cert), authorized_keys format.
	PublicKey []byte `json:"public_key,omitempty"`
}

// AccessRequestCertAnswer answers op cert.
type AccessRequestCertAnswer struct {
	Cert []byte `json:"cert"`
}

// maxAccessRequestOp bounds the JSON of an access request operation.
const maxAccessRequestOp = 8 << 10

// ParseAccessRequestOp reads the JSON after SubsystemAccessRequestPrefix:
// one object with known fields only, a known op, at most 8 KiB.
func ParseAccessRequestOp(raw string) (AccessRequestOp, error) {
	var op AccessRequestOp
	if len(raw) > maxAccessRequestOp {
		return op, trace.BadParameter("access request operation longer than %d bytes", maxAccessRequestOp)
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&op); err != nil {
		return op, trace.BadParameter("invalid access request operation: %v", err)
	}
	if dec.More() {
		return op, trace.BadParameter("invalid access request operation: trailing data after the object")
	}
	switch op.Op {
	case AccessRequestOpCreate, AccessRequestOpList, AccessRequestOpShow, AccessRequestOpReview, AccessRequestOpCert:
	default:
		return op, trace.BadParameter("unknown access request operation %q: want %s, %s, %s, %s or %s", op.Op,
			AccessRequestOpCreate, AccessRequestOpList, AccessRequestOpShow, AccessRequestOpReview, AccessRequestOpCert)
	}
	return op, nil
}

// SubsystemSessionMFACert is the subsystem through which psh gets a
// per-session certificate for a node a require_session_mfa role reaches:
// psh writes one JSON SessionMFACertRequest and closes its side; the
// proxy answers one JSON SessionMFACertResponse, or says why not on
// stderr with exit status 1.
const SubsystemSessionMFACert = "session-mfa-cert"

// SessionMFACertRequest asks for a per-session certificate.
type SessionMFACertRequest struct {
	// Target is the node as psh ssh names it (HOST[:PORT]); Cluster is
	// empty for the proxy's own.
	Target  string `json:"target"`
	Cluster string `json:"cluster,omitempty"`
	// Login is the login of the session.
	Login string `json:"login"`
	// OTP is a fresh TOTP code; or Browser asks to confirm the session
	// with a passkey in the browser instead.
	OTP     string                  `json:"otp,omitempty"`
	Browser *SessionMFABrowserLogin `json:"browser,omitempty"`
	// PublicKey is psh's key (authorized_keys form), the one its
	// certificate certifies.
	PublicKey string `json:"public_key"`
	// Check asks only whether the session needs a fresh factor (no OTP,
	// no Browser): psh's OpenSSH `Match exec` asks it before every ssh,
	// and prompts only when the answer is yes.
	Check bool `json:"check,omitempty"`
}

// SessionMFABrowserLogin is where the browser confirmation's result goes:
// psh's loopback listener, sealed to psh's key (as psh login --auth web).
type SessionMFABrowserLogin struct {
	RedirectURL string `json:"redirect_url"`
	SealKey     []byte `json:"seal_key"`
}

// SessionMFACertResponse is the per-session certificate (authorized_keys
// form), good for a minute, for that node and login only; or, for a
// browser confirmation, the path of the page that asks for the passkey
// (psh prefixes the proxy's web address).
type SessionMFACertResponse struct {
	Cert string `json:"cert,omitempty"`
	Path string `json:"path,omitempty"`
	// Required answers a Check.
	Required *bool `json:"required,omitempty"`
}

// MsgSessionMFARequired starts the proxy's refusal of a normal
// certificate for a node a require_session_mfa role reaches: psh
// recognizes it and asks for a fresh second factor.
const MsgSessionMFARequired = "this node requires a fresh second factor for each session (require_session_mfa)"
