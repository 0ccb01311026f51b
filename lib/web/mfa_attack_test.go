package web

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// The passkey ceremonies end to end (browser JSON -> web server -> auth
// API client -> auth server), then every attack the relying party must
// refuse, each with a software authenticator that falsifies one thing.

func TestPasskeyLoginAndDevices(t *testing.T) {
	e := newMFAEnv(t)
	ws := e.passwordSession(t, "bob", bobPasswd)
	k := newSoftKey(t)
	e.register(t, ws, k, "yubikey")

	// ping reports the preference.
	code, body := e.do(t, http.MethodGet, "/webapi/ping", nil, webSession{})
	require.Equal(t, http.StatusOK, code)
	var ping webapi.PingResponse
	require.NoError(t, json.Unmarshal(body, &ping))
	require.Equal(t, services.SecondFactorOn, ping.SecondFactor)

	// The password alone no longer logs bob in.
	code, body = e.do(t, http.MethodPost, "/webapi/sessions", map[string]string{"user": "bob", "password": bobPasswd}, webSession{})
	require.Equal(t, http.StatusUnauthorized, code, string(body))

	// Password + passkey does.
	ch := e.beginLogin(t, "bob", bobPasswd)
	code, body = e.finish(t, ch.ChallengeID, k.get(t, ch.WebAuthn, mfaOrigin, ""))
	require.Equal(t, http.StatusOK, code, string(body))
	var sess webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &sess))
	require.Equal(t, "bob", sess.User)
	require.NotEmpty(t, sess.Token)

	// Passwordless: the user handle names bob.
	code, body = e.do(t, http.MethodPost, "/webapi/mfa/login/begin", map[string]any{"passwordless": true}, webSession{})
	require.Equal(t, http.StatusOK, code, string(body))
	var pch authapi.MFAChallenge
	require.NoError(t, json.Unmarshal(body, &pch))
	code, body = e.finish(t, pch.ChallengeID, k.get(t, pch.WebAuthn, mfaOrigin, ""))
	require.Equal(t, http.StatusOK, code, string(body))

	// Devices: listed with the last use; renamed; the last factor cannot
	// go while second_factor requires one.
	code, body = e.do(t, http.MethodGet, "/webapi/mfa/devices", nil, ws)
	require.Equal(t, http.StatusOK, code, string(body))
	var devs []authapi.MFADevice
	require.NoError(t, json.Unmarshal(body, &devs))
	require.Len(t, devs, 1)
	require.Equal(t, "yubikey", devs[0].Name)
	require.Equal(t, services.MFAKindWebAuthn, devs[0].Kind)
	require.False(t, devs[0].LastUsed.IsZero())
	code, body = e.do(t, http.MethodPut, "/webapi/mfa/devices/"+devs[0].ID, map[string]string{"name": "blue key"}, ws)
	require.Equal(t, http.StatusNoContent, code, string(body))
	code, body = e.do(t, http.MethodDelete, "/webapi/mfa/devices/"+devs[0].ID, nil, ws)
	require.Equal(t, http.StatusBadRequest, code, string(body))
	require.Contains(t, string(body), "last second factor")

	// A second key makes the first removable; pctl's view counts them.
	k2 := newSoftKey(t)
	e.register(t, ws, k2, "backup key")
	users, err := e.auth.ListUsers(context.Background())
	require.NoError(t, err)
	for _, u := range users {
		if u.Name == "bob" {
			require.Equal(t, []string{"webauthn:2"}, u.MFA)
		}
	}
	code, body = e.do(t, http.MethodDelete, "/webapi/mfa/devices/"+devs[0].ID, nil, ws)
	require.Equal(t, http.StatusNoContent, code, string(body))
	ch = e.beginLogin(t, "bob", bobPasswd)
	code, _ = e.finish(t, ch.ChallengeID, k.get(t, ch.WebAuthn, mfaOrigin, ""))
	require.Equal(t, http.StatusUnauthorized, code, "a deleted passkey")

	// An admin's reset removes everything, audited.
	n, err := e.auth.ResetMFA(context.Background(), "bob", "admin-1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NotEmpty(t, eventsOf(e.audit, events.MFAReset))
}

func TestPasskeyAttacks(t *testing.T) {
	e := newMFAEnv(t)
	bobWS := e.passwordSession(t, "bob", bobPasswd)
	eveWS := e.passwordSession(t, "eve", evePasswd)
	bobKey, eveKey := newSoftKey(t), newSoftKey(t)
	e.register(t, bobWS, bobKey, "bob's key")
	e.register(t, eveWS, eveKey, "eve's key")

	// refused: the user hears one answer; the audit log says why.
	refused := func(t *testing.T, code int, body []byte, reason string) {
		t.Helper()
		require.Equal(t, http.StatusUnauthorized, code, string(body))
		require.Contains(t, string(body), msgInvalidCredentials)
		requireLastFailure(t, e.audit, reason)
	}

	t.Run("replayed assertion", func(t *testing.T) {
		ch := e.beginLogin(t, "bob", bobPasswd)
		answer := bobKey.get(t, ch.WebAuthn, mfaOrigin, "")
		code, body := e.finish(t, ch.ChallengeID, answer)
		require.Equal(t, http.StatusOK, code, string(body))
		// The same answer to the same challenge: spent.
		code, body = e.finish(t, ch.ChallengeID, answer)
		refused(t, code, body, "already used or expired")
		// The same answer to a fresh challenge: the signed challenge
		// does not match.
		ch2 := e.beginLogin(t, "bob", bobPasswd)
		code, body = e.finish(t, ch2.ChallengeID, answer)
		refused(t, code, body, "Error validating challenge")
	})

	t.Run("wrong origin", func(t *testing.T) {
		ch := e.beginLogin(t, "bob", bobPasswd)
		code, body := e.finish(t, ch.ChallengeID, bobKey.get(t, ch.WebAuthn, "https://evil.example:3080", ""))
		refused(t, code, body, "Error validating origin")
	})

	t.Run("wrong rp id", func(t *testing.T) {
		ch := e.beginLogin(t, "bob", bobPasswd)
		code, body := e.finish(t, ch.ChallengeID, bobKey.get(t, ch.WebAuthn, mfaOrigin, "evil.example"))
		refused(t, code, body, "RP Hash mismatch")
	})

	t.Run("sign count goes backwards", func(t *testing.T) {
		ch := e.beginLogin(t, "bob", bobPasswd)
		code, body := e.finish(t, ch.ChallengeID, bobKey.get(t, ch.WebAuthn, mfaOrigin, ""))
		require.Equal(t, http.StatusOK, code, string(body))
		// A clone of the key, whose counter lags behind.
		clone := *bobKey
		clone.count -= 2
		before := len(eventsOf(e.audit, events.MFACloneWarning))
		ch = e.beginLogin(t, "bob", bobPasswd)
		code, body = e.finish(t, ch.ChallengeID, clone.get(t, ch.WebAuthn, mfaOrigin, ""))
		refused(t, code, body, "signature counter went backwards")
		warnings := eventsOf(e.audit, events.MFACloneWarning)
		require.Len(t, warnings, before+1)
		require.Equal(t, "bob", warnings[len(warnings)-1].User)
		// The real key, ahead, still works.
		ch = e.beginLogin(t, "bob", bobPasswd)
		code, body = e.finish(t, ch.ChallengeID, bobKey.get(t, ch.WebAuthn, mfaOrigin, ""))
		require.Equal(t, http.StatusOK, code, string(body))
	})

	t.Run("challenge used twice", func(t *testing.T) {
		ch := e.beginLogin(t, "bob", bobPasswd)
		// A wrong answer spends the challenge too: no second try on it.
		code, body := e.finish(t, ch.ChallengeID, bobKey.get(t, ch.WebAuthn, "https://evil.example:3080", ""))
		refused(t, code, body, "Error validating origin")
		code, body = e.finish(t, ch.ChallengeID, bobKey.get(t, ch.WebAuthn, mfaOrigin, ""))
		refused(t, code, body, "already used or expired")
	})

	t.Run("challenge expires", func(t *testing.T) {
		ch := e.beginLogin(t, "bob", bobPasswd)
		e.clock.Advance(auth.MFAChallengeTTL + 1)
		code, body := e.finish(t, ch.ChallengeID, bobKey.get(t, ch.WebAuthn, mfaOrigin, ""))
		refused(t, code, body, "already used or expired")
	})

	t.Run("challenge of one user finished by another", func(t *testing.T) {
		// A login challenge begun for bob (with bob's password) answered
		// with eve's key: the assertion is checked against the
		// challenge's user and that user's credentials only.
		ch := e.beginLogin(t, "bob", bobPasswd)
		code, body := e.finish(t, ch.ChallengeID, eveKey.get(t, ch.WebAuthn, mfaOrigin, ""))
		refused(t, code, body, "not owned by the user")
		// A registration begun by bob, finished in eve's session.
		code, body = e.do(t, http.MethodPost, "/webapi/mfa/register/begin", map[string]string{"name": "stolen"}, bobWS)
		require.Equal(t, http.StatusOK, code, string(body))
		var rch authapi.MFAChallenge
		require.NoError(t, json.Unmarshal(body, &rch))
		code, body = e.do(t, http.MethodPost, "/webapi/mfa/register/finish", map[string]any{
			"challenge_id": rch.ChallengeID, "webauthn": json.RawMessage(newSoftKey(t).create(t, rch.WebAuthn, mfaOrigin, "")),
		}, eveWS)
		require.Equal(t, http.StatusUnauthorized, code, string(body))
		require.Contains(t, string(body), "issued to another user")
	})

	t.Run("credential of another user", func(t *testing.T) {
		// Eve knows her own password and holds her own key; a login as
		// eve answered with bob's key (stolen, or a confused browser) is
		// refused: only eve's credentials are allowed.
		ch := e.beginLogin(t, "eve", evePasswd)
		code, body := e.finish(t, ch.ChallengeID, bobKey.get(t, ch.WebAuthn, mfaOrigin, ""))
		refused(t, code, body, "not owned by the user")
		// Registering bob's credential to eve is refused too.
		code, body = e.do(t, http.MethodPost, "/webapi/mfa/register/begin", map[string]string{"name": "bob's key too"}, eveWS)
		require.Equal(t, http.StatusOK, code, string(body))
		var rch authapi.MFAChallenge
		require.NoError(t, json.Unmarshal(body, &rch))
		clone := *bobKey
		code, body = e.do(t, http.MethodPost, "/webapi/mfa/register/finish", map[string]any{
			"challenge_id": rch.ChallengeID, "webauthn": json.RawMessage(clone.create(t, rch.WebAuthn, mfaOrigin, "")),
		}, eveWS)
		require.Equal(t, http.StatusConflict, code, string(body))
	})

	t.Run("wrong password gets no challenge", func(t *testing.T) {
		code, body := e.do(t, http.MethodPost, "/webapi/mfa/login/begin", map[string]any{"user": "bob", "password": "nope"}, webSession{})
		refused(t, code, body, "invalid credentials")
	})
}

// eventsOf returns the recorded events of type typ.
func eventsOf(r *events.Recorder, typ string) []events.Event {
	var out []events.Event
	for _, ev := range r.Events() {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// requireLastFailure asserts the last auth.failed event's reason mentions
// want: the user is told "invalid credentials" whatever the cause, the
// audit log says which.
func requireLastFailure(t *testing.T, r *events.Recorder, want string) {
	t.Helper()
	failed := eventsOf(r, events.AuthFailed)
	require.NotEmpty(t, failed)
	require.Contains(t, failed[len(failed)-1].Fields[events.FieldReason], want)
}
