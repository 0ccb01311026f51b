package web

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// loginRegisterOnly logs a user without factors in with the password
// while a factor is required: a register-only session.
func (e *mfaEnv) loginRegisterOnly(t *testing.T, user, pw string) webSession {
	t.Helper()
	code, body, cookies := e.doCookies(t, http.MethodPost, "/webapi/sessions", map[string]string{"user": user, "password": pw}, webSession{})
	require.Equal(t, http.StatusOK, code, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	require.True(t, out.RegisterOnly, string(body))
	require.Equal(t, user, out.User)
	ws := webSession{token: out.Token}
	for _, c := range cookies {
		if c.Name == SessionCookieName {
			ws.cookie = c
		}
	}
	require.NotNil(t, ws.cookie)
	return ws
}

// TestRegisterOnlySession: a user without a second factor while one is
// required logs in with the password into a session that can only
// register a passkey; every other call, and a certificate for it, is
// refused; registering ends it, and the user then logs in with the
// passkey.
func TestRegisterOnlySession(t *testing.T) {
	e := newMFAEnv(t)
	ws := e.loginRegisterOnly(t, "bob", bobPasswd)
	_, err := e.audit.Wait(context.Background(), events.AuthLogin, func(ev events.Event) bool {
		return ev.User == "bob" && ev.Fields["register_only"] == true
	})
	require.NoError(t, err, "the register-only login is audited as such")

	// Nothing but the Account page's calls.
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/webapi/nodes"},
		{http.MethodGet, "/webapi/clusters"},
		{http.MethodGet, "/webapi/terminals"},
		{http.MethodGet, "/webapi/recordings"},
		{http.MethodPut, "/webapi/mfa/devices/x"},
		{http.MethodDelete, "/webapi/mfa/devices/x"},
	} {
		code, body := e.do(t, c.method, c.path, map[string]string{"name": "x"}, ws)
		require.Equal(t, http.StatusForbidden, code, "%s %s: %s", c.method, c.path, body)
		require.Contains(t, string(body), "can only register a second factor", "%s %s", c.method, c.path)
	}
	code, body := e.do(t, http.MethodGet, "/webapi/mfa/devices", nil, ws)
	require.Equal(t, http.StatusOK, code, string(body))
	require.JSONEq(t, `[]`, string(body))

	// Auth certifies no key for it, whatever a proxy asks.
	_, err = e.auth.WebSessionCerts(context.Background(), authapi.WebSessionCertRequest{
		SessionID: ws.cookie.Value, Token: ws.token, PublicKey: []byte(testPublicKey(t)),
	})
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	// The password alone still logs no one in through psh's door.
	code, body = e.do(t, http.MethodPost, "/webapi/ssh/certs", map[string]string{"user": "bob", "password": bobPasswd, "pub_key": testPublicKey(t)}, webSession{})
	require.Equal(t, http.StatusUnauthorized, code, string(body))

	// Registering ends the session.
	k := newSoftKey(t)
	code, body = e.do(t, http.MethodPost, "/webapi/mfa/register/begin", map[string]string{"name": "first key"}, ws)
	require.Equal(t, http.StatusOK, code, string(body))
	var ch authapi.MFAChallenge
	require.NoError(t, json.Unmarshal(body, &ch))
	code, body = e.do(t, http.MethodPost, "/webapi/mfa/register/finish", map[string]any{
		"challenge_id": ch.ChallengeID, "webauthn": json.RawMessage(k.create(t, ch.WebAuthn, mfaOrigin, "")),
	}, ws)
	require.Equal(t, http.StatusOK, code, string(body))
	var reg struct {
		Name    string `json:"name"`
		Relogin bool   `json:"relogin"`
	}
	require.NoError(t, json.Unmarshal(body, &reg))
	require.Equal(t, "first key", reg.Name)
	require.True(t, reg.Relogin)
	code, body = e.do(t, http.MethodGet, "/webapi/mfa/devices", nil, ws)
	require.Equal(t, http.StatusUnauthorized, code, "the register-only session ended: %s", body)

	// Now the password alone is refused, and password + passkey is a
	// full session.
	code, body = e.do(t, http.MethodPost, "/webapi/sessions", map[string]string{"user": "bob", "password": bobPasswd}, webSession{})
	require.Equal(t, http.StatusUnauthorized, code, string(body))
	lch := e.beginLogin(t, "bob", bobPasswd)
	code, body, cookies := e.doCookies(t, http.MethodPost, "/webapi/mfa/login/finish", map[string]any{"challenge_id": lch.ChallengeID, "webauthn": json.RawMessage(k.get(t, lch.WebAuthn, mfaOrigin, ""))}, webSession{})
	require.Equal(t, http.StatusOK, code, string(body))
	var sess webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &sess))
	require.False(t, sess.RegisterOnly)
	full := webSession{token: sess.Token}
	for _, c := range cookies {
		if c.Name == SessionCookieName {
			full.cookie = c
		}
	}
	code, body = e.do(t, http.MethodGet, "/webapi/nodes", nil, full)
	require.Equal(t, http.StatusOK, code, string(body))
}

// TestRegisterOnlyNeedsPasskeysAllowed: with second_factor otp there is
// nothing a user could register in the browser (an admin enrols a TOTP):
// the login is refused as before, and so is a wrong password.
func TestRegisterOnlyNeedsPasskeysAllowed(t *testing.T) {
	e := newMFAEnv(t)
	code, body := e.do(t, http.MethodPost, "/webapi/sessions", map[string]string{"user": "bob", "password": "wrong"}, webSession{})
	require.Equal(t, http.StatusUnauthorized, code, string(body))
	ctx := context.Background()
	require.NoError(t, e.store.SetAuthPreference(ctx, &services.AuthPreference{Spec: services.AuthPreferenceSpec{SecondFactor: services.SecondFactorOTP}}))
	code, body = e.do(t, http.MethodPost, "/webapi/sessions", map[string]string{"user": "bob", "password": bobPasswd}, webSession{})
	require.Equal(t, http.StatusUnauthorized, code, string(body))
}

// doCookies is do that also returns the cookies the answer set.
func (e *mfaEnv) doCookies(t *testing.T, method, path string, body any, ws webSession) (int, []byte, []*http.Cookie) {
	t.Helper()
	data, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(data))
	require.NoError(t, err)
	if ws.cookie != nil {
		req.AddCookie(&http.Cookie{Name: SessionCookieName, Value: ws.cookie.Value})
	}
	if ws.token != "" {
		req.Header.Set("Authorization", "Bearer "+ws.token)
	}
	resp, err := e.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out, resp.Cookies()
}

// testPublicKey is a fresh SSH public key in authorized_keys form.
func testPublicKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sshPub, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return string(ssh.MarshalAuthorizedKey(sshPub))
}
