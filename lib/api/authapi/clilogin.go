package authapi

import "encoding/json"

// psh login --auth web: the whole login happens on the proxy's own web
// login page, and the certificate goes back to psh through the same
// sealed loopback hand-off as a single sign-on login (SSOClientLogin).
// Two calls, both the proxy's:
//
//  1. POST /v1/cli-logins: CreateCLILogin keeps what psh asked for (its
//     key, TTL, loopback URL and seal key) in the backend for
//     SSOStateTTL under a random id, which psh puts in the URL it opens.
//  2. POST /v1/cli-logins/finish: FinishCLILogin, once the browser has
//     logged in there (any way: password, second factors, passkey,
//     single sign-on) and the user approved, takes the request (once),
//     checks that the web session was created after it, and issues the
//     certificate for the session's user through the same seam as every
//     login, sealed to psh's key.

// CLILoginResponse answers CreateCLILogin.
type CLILoginResponse struct {
	// ID names the request in the login page's URL and in its finish.
	ID string `json:"id"`
}

// CLILoginFinishRequest finishes a CLI login with the browser's web
// session.
type CLILoginFinishRequest struct {
	WebSessionRequest
	// ID is CLILoginResponse.ID.
	ID string `json:"id"`
	// ChallengeID and WebAuthn answer, for a per-session request
	// (SessionMFALoginRequest), a challenge of POST /v1/mfa/session/begin.
	ChallengeID string          `json:"challenge_id,omitempty"`
	WebAuthn    json.RawMessage `json:"webauthn,omitempty"`
	// RemoteAddr is the browser's address, for audit.
	RemoteAddr string `json:"remote_addr,omitempty"`
}

// SessionMFALoginRequest starts, for psh ssh to a node a
// require_session_mfa role reaches, the confirmation of that session
// with a passkey in the browser (POST /v1/cli-logins/session): the page
// at the answered id asks for the passkey, and the per-session
// certificate reaches psh sealed, as a CLI login's result does.
type SessionMFALoginRequest struct {
	SessionMFAIdentity
	Client SSOClientLogin `json:"client"`
	// Node (UUID), Cluster and Login name the session.
	Node    string `json:"node"`
	Cluster string `json:"cluster"`
	Login   string `json:"login"`
}
