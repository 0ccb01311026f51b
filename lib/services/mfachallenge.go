package services

import (
	"context"
	"encoding/json"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// A WebAuthn ceremony is begun by one request and finished by another,
// possibly at another proxy: what the second needs (the challenge, who it
// was issued to, what for) lives in the backend, one item per ceremony,
// until it is finished once or expires.
const mfaChallengesPrefix = "mfa_challenges"

// Purposes of an MFAChallenge.
const (
	// MFAPurposeRegister: adding a passkey to a logged-in user.
	MFAPurposeRegister = "register"
	// MFAPurposeLogin: a passkey as the second factor after the
	// password (the password was checked when the challenge was made).
	MFAPurposeLogin = "login"
	// MFAPurposePasswordless: a discoverable passkey alone; the user is
	// whoever its user handle names.
	MFAPurposePasswordless = "passwordless"
	// MFAPurposeSession: a passkey for one new session to a node a
	// require_session_mfa role reaches (the user is logged in already).
	MFAPurposeSession = "session"
)

// MFAChallenge is one ceremony under way.
type MFAChallenge struct {
	// ID is random: the key component and what the client sends back.
	ID string `json:"id"`
	// User the challenge was issued to; empty for passwordless.
	User string `json:"user,omitempty"`
	// Purpose is one of the MFAPurpose constants.
	Purpose string `json:"purpose"`
	// Session is the WebAuthn library's session data (the challenge,
	// the allowed credentials, the user verification asked).
	Session json.RawMessage `json:"session"`
	// DeviceName is, for a registration, the name the user chose.
	DeviceName string `json:"device_name,omitempty"`
	// Expires is when the ceremony can no longer be finished.
	Expires time.Time `json:"expires"`
}

func mfaChallengeKey(id string) string { return backend.Key(mfaChallengesPrefix, id) }

// CreateMFAChallenge stores a ceremony until c.Expires.
func (s *Store) CreateMFAChallenge(ctx context.Context, c MFAChallenge) error {
	if err := checkKeyComponent("challenge id", c.ID); err != nil {
		return trace.Wrap(err)
	}
	if c.Expires.IsZero() {
		return trace.BadParameter("an MFA challenge needs an expiry")
	}
	return trace.Wrap(s.create(ctx, mfaChallengeKey(c.ID), c, c.Expires))
}

// TakeMFAChallenge returns a ceremony and deletes it: the backend's delete
// succeeds for one caller only, so among any number of proxies and auth
// servers a challenge is finished at most once, whether the answer
// verifies or not. NotFound when it does not exist, was taken or expired.
func (s *Store) TakeMFAChallenge(ctx context.Context, id string) (*MFAChallenge, error) {
	const notFound = "the WebAuthn challenge is unknown, already used or expired"
	if checkKeyComponent("challenge id", id) != nil {
		return nil, trace.NotFound(notFound)
	}
	var c MFAChallenge
	if err := s.get(ctx, mfaChallengeKey(id), &c, notFound); err != nil {
		return nil, err
	}
	if err := s.b.Delete(ctx, mfaChallengeKey(id)); err != nil {
		if trace.IsNotFound(err) {
			return nil, trace.NotFound(notFound)
		}
		return nil, trace.Wrap(err)
	}
	return &c, nil
}
