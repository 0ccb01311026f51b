package authapi

import (
	"fmt"
	"time"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// PingResponse answers GET /v1/ping.
type PingResponse struct {
	ClusterName string `json:"cluster_name"`
	// ID and Role echo the caller's identity as the server saw it.
	ID   string `json:"id"`
	Role string `json:"role"`
}

// RegisterRequest is a join: a token exchanged for host certificates.
type RegisterRequest struct {
	Token string `json:"token"`
	// Role is RoleNode or RoleProxy and must match the token's type.
	Role string `json:"role"`
	// UUID must be empty: the auth server mints the host's UUID (see
	// auth.Server.RegisterUsingToken). The field exists only so that a request that
	// carries one (an older host, or someone trying to take a node's
	// identity) is refused with a clear error instead of a JSON one.
	UUID string `json:"uuid,omitempty"`
	// Hostname is the host's name (--nodename); it becomes a principal.
	Hostname string `json:"hostname"`
	// Addr is the host:port it serves SSH on; its host becomes a principal.
	Addr string `json:"addr,omitempty"`
	// AdditionalPrincipals are more SSH principals (IPs, public names);
	// the auth server checks each.
	AdditionalPrincipals []string `json:"additional_principals,omitempty"`
	// SSHPublicKey is the host key, authorized_keys format.
	SSHPublicKey []byte `json:"ssh_public_key"`
	// TLSPublicKey is the TLS key, PKIX DER or PEM.
	TLSPublicKey []byte `json:"tls_public_key"`
	// RemoteAddr is the joining connection's address, set by the API
	// server for the log; never read from the wire.
	RemoteAddr string `json:"-"`
}

// RegisterResponse carries the new host's certificates and the cluster's
// CA keys.
type RegisterResponse struct {
	// UUID is the host UUID the auth server minted for the joiner: the CN
	// of TLSCert and the KeyId of SSHCert. The host keeps it in its data
	// dir as its identity from now on.
	UUID string `json:"uuid"`
	// SSHCert is the SSH host certificate, authorized_keys format.
	SSHCert []byte `json:"ssh_cert"`
	// TLSCert is the X.509 client certificate, PEM.
	TLSCert []byte `json:"tls_cert"`
	// TLSCACerts are the cluster's TLS CA certificates, PEM.
	TLSCACerts [][]byte `json:"tls_ca_certs"`
	// SSHHostCAKeys and SSHUserCAKeys are authorized_keys lines.
	SSHHostCAKeys []string `json:"ssh_host_ca_keys"`
	SSHUserCAKeys []string `json:"ssh_user_ca_keys"`
}

// UserCertRequest asks for an SSH user certificate (POST /v1/certs/user).
type UserCertRequest struct {
	// User is the Postern user name.
	User string `json:"user"`
	// PublicKey is the key to certify, in authorized_keys format.
	PublicKey []byte `json:"public_key"`
	// TTL is the wanted lifetime; zero or more than the roles allow means
	// the roles' max_session_ttl.
	TTL time.Duration `json:"ttl"`
}

// CertResponse answers POST /v1/certs/user.
type CertResponse struct {
	Cert []byte `json:"cert"`
}

// AuthRequest is a login attempt (POST /v1/login).
type AuthRequest struct {
	User     string `json:"user"`
	Password string `json:"password"`
	// OTP is the one-time password; required when the user has a secret.
	OTP string `json:"otp,omitempty"`
	// RemoteAddr is the end user's address (host or host:port) for the
	// per-address limit; the proxy passes its client's address.
	RemoteAddr string `json:"remote_addr,omitempty"`
}

// SSHLoginRequest is AuthRequest plus the key to certify (POST
// /v1/login/ssh).
type SSHLoginRequest struct {
	AuthRequest
	// PublicKey is the user's key, authorized_keys format.
	PublicKey []byte `json:"public_key"`
	// TTL is the wanted certificate lifetime (capped by the roles).
	TTL time.Duration `json:"ttl"`
	// WebSession, when set, asks auth to store a browser session for the
	// user this login authenticates, expiring with the certificate. The
	// proxy made both secrets up and sends only their hashes; a session
	// record exists only as the outcome of a login.
	WebSession *WebSessionInit `json:"web_session,omitempty"`
}

// WebSessionInit is the part of a web login that the backend keeps.
type WebSessionInit struct {
	// Key is the hex SHA-256 of the session id (the cookie).
	Key string `json:"key"`
	// TokenHash is SHA-256 of the bearer token.
	TokenHash []byte `json:"token_hash"`
}

// WebSessionCertRequest asks for a certificate for the user of a web
// session that another proxy created (POST /v1/websessions/certs). Both
// secrets of the session are required, as the browser sent them: a proxy
// cannot act for a user whose session it was not shown.
type WebSessionCertRequest struct {
	SessionID string `json:"session_id"`
	Token     string `json:"token"`
	// PublicKey is the key to certify, authorized_keys format; it never
	// leaves the proxy that asks.
	PublicKey []byte `json:"public_key"`
}

// WebSessionRequest names a web session by the two secrets the browser
// presented to the proxy (POST /v1/websessions/get, .../touch,
// .../delete): auth derives the record's key from SessionID and checks
// Token against the record, so a proxy acts only on sessions a browser
// showed it. LastActive is a touch's time.
type WebSessionRequest struct {
	SessionID  string    `json:"session_id"`
	Token      string    `json:"token"`
	LastActive time.Time `json:"last_active,omitzero"`
}

// SSHLoginResponse is what psh receives: the certificate and the keys to
// trust for hosts.
type SSHLoginResponse struct {
	Username    string       `json:"username"`
	Cert        []byte       `json:"cert"`
	HostSigners []HostSigner `json:"host_signers"`
	// RegisterOnly: the login created a web session that can only
	// register a second factor (the user has none while auth_preference
	// requires one); Cert and HostSigners are empty.
	RegisterOnly bool `json:"register_only,omitempty"`
}

// HostSigner lists one cluster's host CA keys (authorized_keys format).
type HostSigner struct {
	ClusterName  string   `json:"cluster_name"`
	CheckingKeys []string `json:"checking_keys"`
}

// CreateUserRequest is the body of POST /v1/users.
type CreateUserRequest struct {
	Name     string   `json:"name"`
	Password string   `json:"password"`
	Logins   []string `json:"logins,omitempty"`
	Roles    []string `json:"roles,omitempty"`
	OTP      bool     `json:"otp,omitempty"`
}

// UpdateUserRequest is the body of PUT /v1/users/{name}: the fields
// given replace the user's; an absent (null) one is left as it is.
type UpdateUserRequest struct {
	Roles  []string `json:"roles,omitempty"`
	Logins []string `json:"logins,omitempty"`
}

// ResetPasswordRequest is the body of PUT /v1/users/{name}/password.
type ResetPasswordRequest struct {
	Password string `json:"password"`
}

// ResetPasswordResponse answers it: how many of the user's web sessions
// were ended.
type ResetPasswordResponse struct {
	WebSessionsEnded int `json:"web_sessions_ended"`
}

// CreateUserResponse answers POST /v1/users: the TOTP enrolment URL when
// the user was created with OTP.
type CreateUserResponse struct {
	TOTPURL string `json:"totp_url,omitempty"`
}

// ClearLockoutResponse answers DELETE /v1/users/{name}/lockout[?addr=A]:
// whether anything was cleared.
type ClearLockoutResponse struct {
	Cleared bool `json:"cleared"`
}

// CreateTokenRequest is the body of POST /v1/tokens.
type CreateTokenRequest struct {
	Type string            `json:"type"`
	TTL  services.Duration `json:"ttl,omitempty"`
}

// LockRequest is the body of PUT /v1/locks.
type LockRequest struct {
	Target  services.LockTarget `json:"target"`
	Message string              `json:"message,omitempty"`
	// TTL, when set, makes the lock expire by itself (the backend's TTL).
	TTL services.Duration `json:"ttl,omitempty"`
}

// ShipEventsRequest is the body of POST /v1/events.
type ShipEventsRequest struct {
	Events []events.Event `json:"events"`
}

// ShipEventsResponse says how many events of a batch were recorded and how
// many were refused (a type a host may not ship).
type ShipEventsResponse struct {
	Accepted int `json:"accepted"`
	Refused  int `json:"refused"`
}

// WatchEvent is one line of a watch stream (/v1/watch/...): JSON lines
// over one long HTTP response.
type WatchEvent struct {
	// Type is "init", "put", "delete", "error" (the server's watcher
	// broke; Error says why, and the stream ends) or "ping" (a keep-alive,
	// sent only to a client that asked with keepalive=1).
	Type     string    `json:"type"`
	Key      string    `json:"key,omitempty"`
	Value    []byte    `json:"value,omitempty"`
	Expires  time.Time `json:"expires,omitzero"`
	Revision int64     `json:"revision,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// WatchEventPing is a watch stream's keep-alive line.
const WatchEventPing = "ping"

// KnownHostsLines formats host CA keys (HostSigner.CheckingKeys) as
// known_hosts lines ("@cert-authority * KEY"), for psh and `pctl auth
// sign`: the local cluster's host CA, which vouches for every name.
func KnownHostsLines(hostCAKeys []string) []string {
	return ScopedKnownHostsLines("*", hostCAKeys)
}

// ScopedKnownHostsLines formats host CA keys as known_hosts lines that
// vouch only for names matching patterns (comma-separated OpenSSH host
// patterns): "*.LEAF" for a leaf cluster's host CA.
func ScopedKnownHostsLines(patterns string, hostCAKeys []string) []string {
	out := make([]string, 0, len(hostCAKeys))
	for _, k := range hostCAKeys {
		out = append(out, fmt.Sprintf("@cert-authority %s %s", patterns, k))
	}
	return out
}

// TunnelConnectionsRequest is the body of POST /v1/tunnel_connections
// (write or renew the leases of the tunnels a proxy holds) and of POST
// /v1/tunnel_connections/delete (the tunnels closed). The proxy is always
// the caller's certificate's ID: ProxyUUID may be given only to say so,
// and naming any other proxy is refused and audited.
type TunnelConnectionsRequest struct {
	// ProxyUUID, when set, must be the caller's own UUID.
	ProxyUUID string `json:"proxy_uuid,omitempty"`
	// PeerAddr is where the caller serves peered dials (host:port).
	PeerAddr string `json:"peer_addr,omitempty"`
	// NodeUUIDs are the nodes whose tunnels the caller holds (or closed).
	NodeUUIDs []string `json:"node_uuids"`
}

// MaxTunnelConnectionsPerRequest bounds one lease request, so that a
// proxy with many tunnels renews in batches and one request stays small.
const MaxTunnelConnectionsPerRequest = 1000

// TrustedClusterRequest is a leaf cluster's auth server establishing
// trust with a root (POST /v1/trustedclusters/register on the root's join
// listener, relayed by the root's proxy). The token is the credential;
// the TLS under it is pinned to the root's CA by the leaf.
type TrustedClusterRequest struct {
	// Token is the secret part of the root's trusted_cluster token.
	Token string `json:"token"`
	// RootName is the cluster name the leaf's operator wrote in the
	// trusted_cluster (metadata.name): the root refuses before spending
	// the token when it is not its own, so a typo costs nothing.
	RootName string `json:"root_name"`
	// LeafName is the leaf's cluster name.
	LeafName string `json:"leaf_name"`
	// HostCAKeys and UserCAKeys are the leaf's CA public keys,
	// authorized_keys lines.
	HostCAKeys []string `json:"host_ca_keys"`
	UserCAKeys []string `json:"user_ca_keys"`
	// RemoteAddr is set by the API server for the log; never read from
	// the wire.
	RemoteAddr string `json:"-"`
}

// TrustedClusterResponse carries the root's CA public keys.
type TrustedClusterResponse struct {
	ClusterName string   `json:"cluster_name"`
	HostCAKeys  []string `json:"host_ca_keys"`
	UserCAKeys  []string `json:"user_ca_keys"`
}

// LeafTunnelCertRequest asks for a leaf tunnel certificate (POST
// /v1/certs/leaf, proxies only): the key to certify, authorized_keys
// format. The certificate names the calling proxy.
type LeafTunnelCertRequest struct {
	PublicKey []byte `json:"public_key"`
}

// SecondFactorResponse answers GET /v1/second-factor: the cluster's second
// factor as the proxy's unauthenticated /webapi/ping reports it
// (webapi.SecondFactorOff or webapi.SecondFactorOTP).
type SecondFactorResponse struct {
	SecondFactor string `json:"second_factor"`
}

// OpenSSHNodeRequest registers a stock OpenSSH server (POST
// /v1/nodes/openssh) or reissues its host certificate (POST
// /v1/nodes/openssh/{name}/rotate, where only PublicKey is read).
type OpenSSHNodeRequest struct {
	// Name is the node's hostname: what users type, and a principal of
	// its host certificate (with NAME.CLUSTER).
	Name string `json:"name"`
	// Addr is HOST:PORT, where the proxies dial it; HOST is a principal
	// too, so that `ssh -J proxy HOST` verifies.
	Addr   string            `json:"addr"`
	Labels map[string]string `json:"labels,omitempty"`
	// PublicKey is the server's public host key, in authorized_keys
	// format: the key its HostKey holds, which the certificate certifies.
	PublicKey []byte `json:"public_key"`
}

// OpenSSHNodeResponse is what the server needs: its host certificate and
// the user CA keys to trust, with the record as stored.
type OpenSSHNodeResponse struct {
	Node services.Node `json:"node"`
	// HostCert is the host certificate, one authorized_keys line.
	HostCert []byte `json:"host_cert"`
	// UserCAKeys are the cluster's user CA public keys (authorized_keys
	// lines), for TrustedUserCAKeys.
	UserCAKeys []string `json:"user_ca_keys"`
}

// OpenSSHRootUserCertRequest asks a leaf's auth server (POST
// /v1/nodes/openssh/{uuid}/root-user-cert, proxies only) for a
// certificate with which a root cluster's user reaches that OpenSSH node
// through the root proxy's web terminal.
type OpenSSHRootUserCertRequest struct {
	// Cert is the root user's certificate, one authorized_keys line, as
	// the root proxy sent it in its proxyapi.LeafRequest.
	Cert []byte `json:"cert"`
}

// OpenSSHRootUserCertResponse carries the certificate: the root user's
// key, signed by this cluster's user CA, naming the logins the user's
// mapped roles allow on the node.
type OpenSSHRootUserCertResponse struct {
	Cert []byte `json:"cert"`
}
