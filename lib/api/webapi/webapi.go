// Package webapi holds the bodies of the proxy's web API (/webapi/...,
// docs/reference.md, Web API): what the proxy's lib/web serves and what psh and the
// browser UI send and read. The web terminal's frames are not here (they
// belong to the terminal's own protocol). See package api for why it
// imports nothing of the servers.
package webapi

import (
	"encoding/json"
	"time"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/proxyapi"
)

// PingResponse is GET /webapi/ping: what a client learns before logging in.
type PingResponse struct {
	ClusterName  string `json:"cluster_name"`
	ProxySSHAddr string `json:"proxy_ssh_addr"`
	// TunnelAddr is the proxy's reverse tunnel port (nodes behind NAT
	// dial it); empty when the proxy takes no tunnels.
	TunnelAddr    string `json:"tunnel_addr,omitempty"`
	SecondFactor  string `json:"second_factor"`
	ServerVersion string `json:"server_version"`
	// Connectors are the single sign-on connectors a user may log in
	// with (a button each on the login page, psh login --auth NAME);
	// absent when there are none or auth could not say.
	Connectors []authapi.SSOConnectorInfo `json:"connectors,omitempty"`
}

// SSOConsoleLoginRequest is the body of POST /webapi/oidc/login/console:
// psh starts a single sign-on login whose result the proxy hands to its
// loopback listener, sealed to SealKey.
type SSOConsoleLoginRequest struct {
	// Connector names the oidc_connector.
	Connector string `json:"connector"`
	// PubKey is the key to certify, authorized_keys format.
	PubKey string `json:"pub_key"`
	// TTLSeconds is the wanted certificate lifetime; zero means the
	// roles' max_session_ttl.
	TTLSeconds int64 `json:"ttl_seconds"`
	// RedirectURL is psh's loopback listener,
	// http://127.0.0.1:PORT/callback.
	RedirectURL string `json:"redirect_url"`
	// SealKey is psh's ephemeral X25519 public key (32 bytes; base64 in
	// JSON).
	SealKey []byte `json:"seal_key"`
}

// SSOConsoleLoginResponse answers SSOConsoleLoginRequest: where psh sends
// the browser (the identity provider's login page).
type SSOConsoleLoginResponse struct {
	AuthURL string `json:"auth_url"`
}

// WebConsoleLoginRequest is the body of POST /webapi/login/console: psh
// login --auth web starts a login on the proxy's web login page, whose
// result the browser hands to psh's loopback listener, sealed to SealKey.
type WebConsoleLoginRequest struct {
	// PubKey is the key to certify, authorized_keys format.
	PubKey string `json:"pub_key"`
	// TTLSeconds is the wanted certificate lifetime; zero means the
	// roles' max_session_ttl.
	TTLSeconds int64 `json:"ttl_seconds"`
	// RedirectURL is psh's loopback listener,
	// http://127.0.0.1:PORT/callback.
	RedirectURL string `json:"redirect_url"`
	// SealKey is psh's ephemeral X25519 public key (32 bytes; base64 in
	// JSON).
	SealKey []byte `json:"seal_key"`
}

// WebConsoleLoginResponse answers WebConsoleLoginRequest: the login
// page's path on the proxy (psh prefixes the address it was given).
type WebConsoleLoginResponse struct {
	Path string `json:"path"`
}

// WebConsoleFinishRequest is the body of POST
// /webapi/login/console/finish: the logged-in browser gives psh its
// certificate.
type WebConsoleFinishRequest struct {
	ID string `json:"id"`
	// ChallengeID and WebAuthn answer the challenge of POST
	// /webapi/login/console/challenge, for a psh session's confirmation.
	ChallengeID string          `json:"challenge_id,omitempty"`
	WebAuthn    json.RawMessage `json:"webauthn,omitempty"`
}

// WebConsoleFinishResponse is where the browser goes next: psh's
// loopback listener with the sealed result.
type WebConsoleFinishResponse struct {
	RedirectURL string `json:"redirect_url"`
}

// Values of PingResponse.SecondFactor.
const (
	SecondFactorOff = "off"
	SecondFactorOTP = "otp"
	// SecondFactorWebAuthn: logins need a passkey (the web login page).
	SecondFactorWebAuthn = "webauthn"
	// SecondFactorOn: logins need an OTP code or a passkey.
	SecondFactorOn = "on"
)

// SSHLoginRequest is the body of POST /webapi/ssh/certs (docs/reference.md).
type SSHLoginRequest struct {
	User     string `json:"user"`
	Password string `json:"password"`
	OTPToken string `json:"otp_token"`
	// PubKey is the key to certify, authorized_keys format.
	PubKey string `json:"pub_key"`
	// TTLSeconds is the wanted certificate lifetime; zero means the
	// roles' max_session_ttl (auth caps any value by it).
	TTLSeconds int64 `json:"ttl_seconds"`
}

// SSHLoginResponse is the answer of POST /webapi/ssh/certs.
type SSHLoginResponse struct {
	Username string `json:"username"`
	// Cert is the user certificate, authorized_keys format.
	Cert        string               `json:"cert"`
	HostSigners []authapi.HostSigner `json:"host_signers"`
}

// ErrorResponse is the body of every non-2xx answer of the web API.
type ErrorResponse struct {
	Error string `json:"error"`
}

// CreateSessionRequest is the body of POST /webapi/sessions.
type CreateSessionRequest struct {
	User     string `json:"user"`
	Password string `json:"password"`
	OTPToken string `json:"otp_token"`
}

// CreateSessionResponse is its answer; the session cookie is set alongside.
type CreateSessionResponse struct {
	Token   string    `json:"token"`
	Expires time.Time `json:"expires"`
	User    string    `json:"user"`
	// RegisterOnly: the session can only register a second factor (GET
	// /webapi/mfa/devices, POST /webapi/mfa/register/*, DELETE
	// /webapi/sessions); every other call answers 403 until the user has
	// registered one and logged in again with it.
	RegisterOnly bool `json:"register_only,omitempty"`
}

// NodesResponse is GET /webapi/nodes: the same entries as the proxy's
// `nodes` subsystem.
type NodesResponse struct {
	Items []proxyapi.NodeEntry `json:"items"`
}

// ClustersResponse is GET /webapi/clusters: the clusters the session user
// may reach (the proxy's own first), the set `proxysites` lists.
type ClustersResponse struct {
	Items []ClusterEntry `json:"items"`
}

// ClusterEntry is one cluster of ClustersResponse.
type ClusterEntry struct {
	Name          string    `json:"name"`
	Status        string    `json:"status"`
	LastConnected time.Time `json:"last_connected"`
	// Local marks the proxy's own cluster.
	Local bool `json:"local"`
}
