package web

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/nacl/box"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
)

// startCLILogin is psh's start of a login on the web login page: the id
// in the page path, and the key the result is sealed to.
func (e *mfaEnv) startCLILogin(t *testing.T) (id string, pub, priv *[32]byte) {
	t.Helper()
	pub, priv, err := box.GenerateKey(rand.Reader)
	require.NoError(t, err)
	code, body := e.do(t, http.MethodPost, "/webapi/login/console", webapi.WebConsoleLoginRequest{
		PubKey: testPublicKey(t), TTLSeconds: 600, RedirectURL: "http://127.0.0.1:40000/callback", SealKey: pub[:],
	}, webSession{})
	require.Equal(t, http.StatusOK, code, string(body))
	var resp webapi.WebConsoleLoginResponse
	require.NoError(t, json.Unmarshal(body, &resp))
	u, err := url.Parse(resp.Path)
	require.NoError(t, err)
	require.Equal(t, CLILoginPagePath, u.Path)
	return u.Query().Get("id"), pub, priv
}

// fullSession logs bob in with password and passkey k.
func (e *mfaEnv) fullSession(t *testing.T, k *softKey) webSession {
	t.Helper()
	ch := e.beginLogin(t, "bob", bobPasswd)
	code, body, cookies := e.doCookies(t, http.MethodPost, "/webapi/mfa/login/finish", map[string]any{"challenge_id": ch.ChallengeID, "webauthn": json.RawMessage(k.get(t, ch.WebAuthn, mfaOrigin, ""))}, webSession{})
	require.Equal(t, http.StatusOK, code, string(body))
	var sess webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &sess))
	ws := webSession{token: sess.Token}
	for _, c := range cookies {
		if c.Name == SessionCookieName {
			ws.cookie = c
		}
	}
	require.NotNil(t, ws.cookie)
	return ws
}

// TestWebConsoleLogin: the browser's session gives psh a certificate
// sealed to psh's key, once; a session older than psh's request, a
// register-only session and a used or unknown id are refused.
func TestWebConsoleLogin(t *testing.T) {
	e := newMFAEnv(t)
	// bob's first login: register-only, which may not give psh anything.
	ro := e.loginRegisterOnly(t, "bob", bobPasswd)
	id, _, _ := e.startCLILogin(t)
	code, body := e.do(t, http.MethodPost, "/webapi/login/console/finish", map[string]string{"id": id}, ro)
	require.Equal(t, http.StatusForbidden, code, string(body))
	require.Contains(t, string(body), "can only register a second factor")
	k := newSoftKey(t)
	e.register(t, ro, k, "key")

	// A session from before psh's request is not a login for it.
	old := e.fullSession(t, k)
	e.clock.Advance(time.Second)
	id, pub, priv := e.startCLILogin(t)
	code, body = e.do(t, http.MethodPost, "/webapi/login/console/finish", map[string]string{"id": id}, old)
	require.Equal(t, http.StatusForbidden, code, string(body))
	require.Contains(t, string(body), "log in again")

	// A login after it is: the result goes to psh's loopback, sealed.
	e.clock.Advance(time.Second)
	fresh := e.fullSession(t, k)
	code, body = e.do(t, http.MethodPost, "/webapi/login/console/finish", map[string]string{"id": id}, fresh)
	require.Equal(t, http.StatusOK, code, string(body))
	var fin webapi.WebConsoleFinishResponse
	require.NoError(t, json.Unmarshal(body, &fin))
	require.True(t, strings.HasPrefix(fin.RedirectURL, "http://127.0.0.1:40000/callback?response="), fin.RedirectURL)
	u, err := url.Parse(fin.RedirectURL)
	require.NoError(t, err)
	sealed, err := base64.RawURLEncoding.DecodeString(u.Query().Get("response"))
	require.NoError(t, err)
	opened, ok := box.OpenAnonymous(nil, sealed, pub, priv)
	require.True(t, ok, "sealed to psh's key")
	var login authapi.SSHLoginResponse
	require.NoError(t, json.Unmarshal(opened, &login))
	require.Equal(t, "bob", login.Username)
	require.NotEmpty(t, login.Cert)

	// Once only; an unknown id the same.
	code, body = e.do(t, http.MethodPost, "/webapi/login/console/finish", map[string]string{"id": id}, fresh)
	require.Equal(t, http.StatusForbidden, code, string(body))
	require.Contains(t, string(body), "run psh login again")
	code, body = e.do(t, http.MethodPost, "/webapi/login/console/finish", map[string]string{"id": "forged"}, fresh)
	require.Equal(t, http.StatusForbidden, code, string(body))
	// Without a session: nothing.
	code, _ = e.do(t, http.MethodPost, "/webapi/login/console/finish", map[string]string{"id": id}, webSession{})
	require.Equal(t, http.StatusUnauthorized, code)

	// psh's start refuses a redirect off this machine.
	code, body = e.do(t, http.MethodPost, "/webapi/login/console", webapi.WebConsoleLoginRequest{
		PubKey: testPublicKey(t), RedirectURL: "http://evil.example:80/callback", SealKey: pub[:],
	}, webSession{})
	require.Equal(t, http.StatusBadRequest, code, string(body))
}
