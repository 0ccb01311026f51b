package authapi

import "encoding/json"

// Per-session MFA (role option require_session_mfa). A user already
// logged in proves a fresh second factor for one new session to one node
// and gets a per-session certificate for it: short-lived, its principals
// the one login, bound to the node by the postern-session-mfa extension.
// The proxy asks on the user's behalf, naming the user by what proves
// who they are: the web session's secrets (the web terminal) or the
// user's own certificate (psh, over the proxy's SSH port), which auth
// checks against its user CA.

// SessionMFAIdentity names the user: exactly one of the two.
type SessionMFAIdentity struct {
	// WebSession names a web session by its secrets.
	WebSession *WebSessionRequest `json:"web_session,omitempty"`
	// UserCert is the user's certificate (authorized_keys form).
	UserCert []byte `json:"user_cert,omitempty"`
}

// SessionMFABeginRequest starts a passkey ceremony for a new session
// (POST /v1/mfa/session/begin); the answer is an MFAChallenge.
type SessionMFABeginRequest struct {
	SessionMFAIdentity
}

// SessionCertRequest asks for a per-session certificate (POST
// /v1/mfa/session/certs) with a TOTP code or a passkey's answer.
type SessionCertRequest struct {
	SessionMFAIdentity
	// PublicKey is the key to certify (authorized_keys form).
	PublicKey []byte `json:"public_key"`
	// Node is the node's UUID, Cluster its cluster (this cluster), Login
	// the login the session uses.
	Node    string `json:"node"`
	Cluster string `json:"cluster"`
	Login   string `json:"login"`
	// OTP is a TOTP code; or ChallengeID and WebAuthn are a passkey's
	// answer to SessionMFABeginRequest's challenge.
	OTP         string          `json:"otp,omitempty"`
	ChallengeID string          `json:"challenge_id,omitempty"`
	WebAuthn    json.RawMessage `json:"webauthn,omitempty"`
	// RemoteAddr is the user's address, for audit.
	RemoteAddr string `json:"remote_addr,omitempty"`
}

// SessionCertResponse is the per-session certificate.
type SessionCertResponse struct {
	Cert []byte `json:"cert"`
}
