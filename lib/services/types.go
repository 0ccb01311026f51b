// Package services holds Postern's resource types (node, user, role, cert
// authority, cluster networking config, join token), their validation and
// wire format, and typed stores on top of lib/backend.
//
// Resources are plain structs with JSON tags: JSON is what goes into the
// backend, and the same field names are what `pctl get` and `pctl create -f`
// show and accept (YAML is decoded with the JSON names, see yaml.go), so an
// operator reads and writes exactly what is stored.
package services

import (
	"time"
)

// Kinds, as written in `kind:` of a resource file and accepted by `pctl get`.
const (
	KindNode              = "node"
	KindUser              = "user"
	KindRole              = "role"
	KindCertAuthority     = "cert_authority"
	KindClusterNetworking = "cluster_networking_config"
	KindToken             = "token"
	KindProxy             = "proxy"
)

// Proxy is one proxy process of the cluster, heartbeated like a node
// (a TTL'd record, refreshed by the proxy through its auth client). It is
// how every other party finds every proxy: a tunnel agent keeps one tunnel
// to each (dialing each one's TunnelAddr, not a load balancer that lands
// on whichever proxy it likes), and peer proxies dial each other's
// PeerAddr. Expires and LastHeartbeat are the auth server's, never the
// proxy's own.
type Proxy struct {
	// UUID is the proxy's host UUID (the CN and KeyId of its
	// certificates): the record's name.
	UUID string `json:"uuid"`
	// Hostname is the proxy's --nodename (or OS hostname).
	Hostname string `json:"hostname"`
	// Cluster is the cluster the proxy serves.
	Cluster string `json:"cluster"`
	// SSHAddr, WebAddr, TunnelAddr and PeerAddr are where this proxy
	// serves its SSH port (3023), HTTPS port (3080), reverse tunnel port
	// (3024) and peering port (3021), as others should dial them; empty
	// when the proxy does not serve that port.
	SSHAddr    string `json:"ssh_addr,omitempty"`
	WebAddr    string `json:"web_addr,omitempty"`
	TunnelAddr string `json:"tunnel_addr,omitempty"`
	PeerAddr   string `json:"peer_addr,omitempty"`
	// Version is the postern version the proxy runs.
	Version string `json:"version,omitempty"`
	// OfflineOpenSSH lists the OpenSSH nodes (UUIDs) this proxy's health
	// checker found not answering, as of its last heartbeat: OpenSSH
	// nodes send no heartbeat, so the proxies that dial them are the only
	// ones who know, and pctl reads their word here.
	OfflineOpenSSH []string `json:"offline_openssh,omitempty"`
	// Expires is when this record dies unless refreshed.
	Expires time.Time `json:"expires"`
	// LastHeartbeat is when the proxy last announced itself (auth's
	// clock).
	LastHeartbeat time.Time `json:"last_heartbeat"`
}

// Node is one SSH server in the inventory. Nodes write themselves with a TTL
// on every heartbeat; a node that stops heartbeating disappears when Expires
// passes, and routing forgets it.
type Node struct {
	// UUID is the node's name: assigned by the auth server when the node
	// joins (an auth host's own node generates it on first start), kept in
	// its data dir. A node cannot choose it.
	UUID string `json:"uuid"`
	// Hostname is what users type: --nodename, or the OS hostname.
	Hostname string `json:"hostname"`
	// Addr is the host:port the node serves SSH on, as the proxy dials it.
	Addr string `json:"addr"`
	// Labels select which roles reach this node.
	Labels map[string]string `json:"labels,omitempty"`
	// Cluster is the cluster the node belongs to.
	Cluster string `json:"cluster"`
	// Expires is when this record dies unless refreshed by a heartbeat.
	// For a remote node the auth server sets it (LastHeartbeat plus the
	// TTL the node asked for, Expires - LastHeartbeat as sent, capped).
	Expires time.Time `json:"expires"`
	// LastHeartbeat is when the node last announced itself; `most_recent`
	// routing prefers the latest. For a remote node it is the auth
	// server's clock, never the node's.
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// Version is the postern version the node runs.
	Version string `json:"version,omitempty"`
	// Tunnel marks a node reachable only over a reverse tunnel (behind
	// NAT): it has no Addr and the proxy never dials it directly.
	Tunnel bool `json:"tunnel,omitempty"`
	// Kind is what serves SSH at Addr: NodeKindPostern (also written
	// empty, as every record before kinds existed is) for a Postern node
	// that heartbeats, NodeKindOpenSSH for a stock sshd an admin
	// registered, which runs nothing of Postern and so never heartbeats:
	// its record has no Expires, and the proxies health-check it instead.
	Kind string `json:"kind,omitempty"`
}

// Node kinds (Node.Kind).
const (
	// NodeKindPostern is a Postern node (`postern start --roles node`).
	NodeKindPostern = "postern"
	// NodeKindOpenSSH is an OpenSSH server with nothing of Postern on it.
	NodeKindOpenSSH = "openssh"
)

// IsOpenSSH reports whether the node is a stock OpenSSH server
// (NodeKindOpenSSH).
func (n *Node) IsOpenSSH() bool { return n.Kind == NodeKindOpenSSH }

// User is a Postern user.
type User struct {
	Name string `json:"name"`
	// PasswordHash is a bcrypt hash; never sent to clients.
	PasswordHash []byte `json:"password_hash,omitempty"`
	// TOTPSecret, when set, makes a one-time password mandatory at login.
	TOTPSecret string `json:"totp_secret,omitempty"`
	// OTPEnabled says a TOTP secret is set, in views that strip the secret
	// itself (the auth API's user list): pctl must be able to tell who is
	// enrolled without ever receiving a secret. Derived, never stored.
	OTPEnabled bool `json:"otp_enabled,omitempty"`
	// MFA lists the user's second factors in views that strip secrets
	// (`pctl users ls`): "otp", "webauthn:2". Derived, never stored.
	MFA []string `json:"mfa,omitempty"`
	// Roles names the roles granted; default ["access"].
	Roles []string `json:"roles"`
	// Traits are per-user values that role templates expand, e.g.
	// "logins" for {{internal.logins}}.
	Traits map[string][]string `json:"traits,omitempty"`
	// Created is when the user was added.
	Created time.Time `json:"created"`
	// Connector is empty for a local user (password and OTP kept here),
	// and "sso:NAME" (ConnectorMarker) for a user an identity provider's
	// connector created: such a record has no password and is rewritten
	// at every login with the roles and traits the provider's claims gave.
	Connector string `json:"connector,omitempty"`
}

// TraitLogins is the trait `pctl users add --logins` sets.
const TraitLogins = "logins"

// Role grants access. Everything not granted is denied.
type Role struct {
	Kind     string   `json:"kind,omitempty"`
	Version  string   `json:"version,omitempty"`
	Metadata Metadata `json:"metadata"`
	Spec     RoleSpec `json:"spec"`
}

// Metadata names a resource.
type Metadata struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// RoleSpec is what a role allows.
type RoleSpec struct {
	// Logins are OS logins allowed; "{{internal.logins}}" expands to the
	// user's own logins trait.
	Logins []string `json:"logins,omitempty"`
	// NodeLabels selects the nodes this role reaches: every key must match.
	// A value is a literal, "*" (any value), or a regular expression written
	// "^...$". `'*': '*'` matches every node. Empty matches nothing.
	NodeLabels map[string]LabelValues `json:"node_labels,omitempty"`
	// ForwardAgent allows ssh -A.
	ForwardAgent bool `json:"forward_agent,omitempty"`
	// PortForwarding allows ssh -L and -R.
	PortForwarding bool `json:"port_forwarding,omitempty"`
	// MaxSessionTTL caps certificates issued to holders of the role; zero
	// means DefaultMaxSessionTTL.
	MaxSessionTTL Duration `json:"max_session_ttl,omitempty"`
	// Admin lets the holder manage the cluster through pctl.
	Admin bool `json:"admin,omitempty"`
	// ReviewRecordings lets the holder list and play every user's session
	// recordings; without it a user sees only their own.
	ReviewRecordings bool `json:"review_recordings,omitempty"`
	// SessionRecording overrides the cluster's session_recording for the
	// holder's sessions: "require" records them even when the cluster says
	// off (and refuses a session that cannot be recorded), "exempt" leaves
	// them unrecorded unless another of the user's roles requires it.
	// Empty follows the cluster setting.
	SessionRecording string `json:"session_recording,omitempty"`
	// Request names the roles the holder may ask for just in time
	// (psh request create); nil allows none.
	Request *RequestOption `json:"request,omitempty"`
	// ReviewRequests names the roles whose requests the holder may
	// approve or deny; nil allows reviewing none.
	ReviewRequests *ReviewRequestsOption `json:"review_requests,omitempty"`
	// RequireSessionMFA: every new session to a node this role reaches
	// needs a fresh second factor, proven for that session alone (a
	// per-session certificate, lib/auth/sessionmfa.go).
	RequireSessionMFA bool `json:"require_session_mfa,omitempty"`
	// JoinSessions lets the holder join other users' live sessions
	// (sessionjoin.go); RequireSessionJoin holds the holder's own
	// sessions until enough moderators joined.
	JoinSessions       []SessionJoinRule    `json:"join_sessions,omitempty"`
	RequireSessionJoin []SessionRequireRule `json:"require_session_join,omitempty"`
}

// Role session_recording options. require beats exempt: a role that
// demands an audit trail must not be undone by another role the user also
// holds.
const (
	RecordingRequire = "require"
	RecordingExempt  = "exempt"
)

// DefaultMaxSessionTTL is the certificate lifetime cap when a role sets none:
// a working day plus margin, so a morning `psh login` lasts the day.
const DefaultMaxSessionTTL = 12 * time.Hour

// LabelValues is a list of accepted values for one label; in YAML it may be
// written as one string or a list.
type LabelValues []string

// CertAuthType names one of the two SSH certificate authorities.
type CertAuthType string

const (
	// UserCA signs user certificates.
	UserCA CertAuthType = "user"
	// HostCA signs node and proxy host certificates.
	HostCA CertAuthType = "host"
)

// CertAuthority is one CA of one cluster. The private keys live only in the
// auth server's backend and are never returned to other roles.
type CertAuthority struct {
	Type        CertAuthType `json:"type"`
	ClusterName string       `json:"cluster_name"`
	// SSHPublicKeys are the CA's keys in authorized_keys format.
	SSHPublicKeys []string `json:"ssh_public_keys"`
	// SSHPrivateKeys are PEM (OpenSSH format) private keys; stripped on
	// every read that is not the auth server's own.
	SSHPrivateKeys [][]byte `json:"ssh_private_keys,omitempty"`
	// TLSCert and TLSKey (PEM) exist on the host CA only: it is also the
	// X.509 CA of the auth API's mutual TLS.
	TLSCert []byte `json:"tls_cert,omitempty"`
	TLSKey  []byte `json:"tls_key,omitempty"`
}

// Routing strategies of ClusterNetworkingConfig.
const (
	RoutingUnambiguousMatch = "unambiguous_match"
	RoutingMostRecent       = "most_recent"
)

// ClusterNetworkingConfig is the singleton networking config of a cluster.
type ClusterNetworkingConfig struct {
	Kind     string                      `json:"kind,omitempty"`
	Version  string                      `json:"version,omitempty"`
	Metadata Metadata                    `json:"metadata"`
	Spec     ClusterNetworkingConfigSpec `json:"spec"`
}

// ClusterNetworkingConfigSpec is the body of ClusterNetworkingConfig.
type ClusterNetworkingConfigSpec struct {
	// RoutingStrategy decides what happens when a target matches several
	// nodes; default RoutingUnambiguousMatch (an error naming them).
	RoutingStrategy string `json:"routing_strategy,omitempty"`
	// CaseInsensitiveRouting matches hostnames regardless of case.
	CaseInsensitiveRouting bool `json:"case_insensitive_routing,omitempty"`
	// SSHDialTimeout bounds the proxy's dial to a node; zero means
	// DefaultSSHDialTimeout.
	SSHDialTimeout Duration `json:"ssh_dial_timeout,omitempty"`
	// TunnelFindTimeout is how long a dial to a tunnel node waits for its
	// tunnel to reach this proxy (a node reconnecting after a proxy
	// restart); zero means DefaultTunnelFindTimeout.
	TunnelFindTimeout Duration `json:"tunnel_find_timeout,omitempty"`
	// KeepAliveInterval and KeepAliveCountMax time the tunnels'
	// keep-alives; zero means DefaultTunnelKeepAliveInterval and
	// DefaultTunnelKeepAliveCountMax.
	KeepAliveInterval Duration `json:"keep_alive_interval,omitempty"`
	KeepAliveCountMax int      `json:"keep_alive_count_max,omitempty"`
	// SessionRecording is where pty sessions are recorded: "node" (the
	// default: the node records and uploads to auth) or "off".
	SessionRecording string `json:"session_recording,omitempty"`
	// RecordInput adds terminal input to recordings. Off by default:
	// passwords typed at prompts are input.
	RecordInput bool `json:"record_input,omitempty"`
	// MaxRecordingBytes caps one session's recording; zero means
	// DefaultMaxRecordingBytes.
	MaxRecordingBytes int64 `json:"max_recording_bytes,omitempty"`
	// NodeAddressNetworks are the networks (CIDR prefixes, or single IPs)
	// in which the auth server may check a node's announced address
	// besides the address the node's heartbeat comes from. Empty (the
	// default) means only that source address: auth dials, on a node's
	// word, nothing but the node itself. Set it when nodes announce an
	// address other than the one they reach auth from (NAT between node
	// and auth, a separate interface for SSH).
	NodeAddressNetworks []string `json:"node_address_networks,omitempty"`
}

// Tunnel defaults (reverse tunnels). 5s to find a tunnel covers
// an agent's first reconnect attempts after a proxy restart (backoff
// 250ms, 500ms, 1s, 2s) without holding a user's dial for long; 5s x 3
// keep-alives find a half-open tunnel within ~15s.
const (
	DefaultTunnelFindTimeout       = 5 * time.Second
	DefaultTunnelKeepAliveInterval = 5 * time.Second
	DefaultTunnelKeepAliveCountMax = 3
	// MaxTunnelFindTimeout bounds how long a user's dial may hang.
	MaxTunnelFindTimeout = 5 * time.Minute
)

// Session recording modes.
const (
	RecordingNode = "node"
	RecordingOff  = "off"
)

// DefaultMaxRecordingBytes (256 MiB) bounds a node's disk use per session
// when someone cats a disk image; the session itself goes on.
const DefaultMaxRecordingBytes = 256 << 20

// DefaultSSHDialTimeout is long enough for a node across a WAN, short
// enough that a dead node fails a user's connection before they give up.
const DefaultSSHDialTimeout = 30 * time.Second

// Token types.
const (
	TokenTypeNode  = "node"
	TokenTypeProxy = "proxy"
	// TokenTypeTrustedCluster tokens are spent by a leaf cluster's auth
	// server establishing trust with this (root) cluster; no host can
	// join with one.
	TokenTypeTrustedCluster = "trusted_cluster"
)

// Token is a join token.
type Token struct {
	// Name is the secret itself.
	Name string `json:"name"`
	// Type is TokenTypeNode, TokenTypeProxy or TokenTypeTrustedCluster.
	Type string `json:"type"`
	// Expires is when the token stops working.
	Expires time.Time `json:"expires"`
	// MultiUse tokens survive a join; by default a token is spent by one.
	MultiUse bool `json:"multi_use,omitempty"`
}
