package authapi

import (
	"encoding/json"
	"time"
)

// Second factors over the auth API (lib/auth/mfa.go and webauthn.go).
// The proxy carries the browser's WebAuthn JSON through unchanged: auth
// alone knows the credentials, checks the answers and keeps the
// challenges, so a ceremony begun at one proxy may finish at another.
// Calls for a logged-in user name the web session by its two secrets
// (WebSessionRequest), the same proof every other web session call takes.

// MFAChallenge is a ceremony begun: what the browser needs to run it.
type MFAChallenge struct {
	// ChallengeID names the ceremony; the finish sends it back.
	ChallengeID string `json:"challenge_id"`
	// WebAuthn is the argument of navigator.credentials.create or .get:
	// {"publicKey": {...}} with binary fields in base64url.
	WebAuthn json.RawMessage `json:"webauthn"`
}

// MFARegisterBeginRequest starts adding a passkey (POST
// /v1/mfa/register/begin).
type MFARegisterBeginRequest struct {
	WebSessionRequest
	// DeviceName is the user's label for it; unique per user.
	DeviceName string `json:"device_name"`
}

// MFAFinishRequest finishes a registration (POST /v1/mfa/register/finish).
type MFAFinishRequest struct {
	WebSessionRequest
	ChallengeID string `json:"challenge_id"`
	// WebAuthn is the PublicKeyCredential the browser returned, as JSON.
	WebAuthn json.RawMessage `json:"webauthn"`
}

// MFALoginBeginRequest starts a passkey login (POST /v1/mfa/login/begin):
// after the password (User and Password set), or passwordless (both
// empty, Passwordless set).
type MFALoginBeginRequest struct {
	User         string `json:"user,omitempty"`
	Password     string `json:"password,omitempty"`
	Passwordless bool   `json:"passwordless,omitempty"`
	// RemoteAddr is the end user's address, for the login limiter and
	// audit.
	RemoteAddr string `json:"remote_addr,omitempty"`
}

// MFALoginFinishRequest finishes a passkey login (POST
// /v1/mfa/login/finish) and asks for what a password login issues.
type MFALoginFinishRequest struct {
	ChallengeID string          `json:"challenge_id"`
	WebAuthn    json.RawMessage `json:"webauthn"`
	// PublicKey is the SSH key to certify, authorized_keys format.
	PublicKey []byte `json:"public_key"`
	// TTL is the wanted certificate lifetime (capped by the roles).
	TTL time.Duration `json:"ttl"`
	// WebSession, when set, is the browser session to create.
	WebSession *WebSessionInit `json:"web_session,omitempty"`
	RemoteAddr string          `json:"remote_addr,omitempty"`
}

// MFADevice is a second factor as its owner sees it (no secrets).
type MFADevice struct {
	ID       string    `json:"id"`
	Kind     string    `json:"kind"`
	Name     string    `json:"name"`
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used,omitzero"`
}

// MFADeviceRequest names one of the session user's devices (POST
// /v1/mfa/devices/rename and /delete); NewName is for a rename.
type MFADeviceRequest struct {
	WebSessionRequest
	ID      string `json:"id"`
	NewName string `json:"new_name,omitempty"`
}

// ResetMFAResponse answers DELETE /v1/users/{name}/mfa.
type ResetMFAResponse struct {
	// Removed is how many factors were removed.
	Removed int `json:"removed"`
}
