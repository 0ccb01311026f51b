package web

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/services"
)

// TestSessionGrants: a per-session token opens one terminal, to the node
// and login it was issued for, within its minute; it is spent by any
// attempt, so a token seen once (a log, a replayed first message) is
// worth nothing.
func TestSessionGrants(t *testing.T) {
	now := time.Now()
	var g sessionGrants
	add := func() string {
		tok, err := g.add(&sessionGrant{node: "n1", login: "root", expires: now.Add(time.Minute)}, now)
		require.NoError(t, err)
		return tok
	}
	tok := add()
	require.Nil(t, g.take(tok, "n2", "root", now), "another node")
	require.Nil(t, g.take(tok, "n1", "root", now), "spent by the failed attempt")
	tok = add()
	require.Nil(t, g.take(tok, "n1", "admin", now), "another login")
	tok = add()
	require.Nil(t, g.take(tok, "n1", "root", now.Add(time.Minute)), "expired")
	tok = add()
	require.Nil(t, g.take("forged", "n1", "root", now))
	require.Nil(t, g.take("", "n1", "root", now))
	require.NotNil(t, g.take(tok, "n1", "root", now))
	require.Nil(t, g.take(tok, "n1", "root", now), "single use")
}

// mfaNodes is the node list of mfaEnv's web server.
type mfaNodes struct {
	// mu guards nodes.
	mu    sync.Mutex
	nodes []services.Node
}

func (m *mfaNodes) GetNodes(context.Context, string) ([]services.Node, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.nodes), nil
}

// TestSessionMFAEndpoints: before a terminal, the page learns whether the
// node needs a fresh factor, proves it (a passkey, or an OTP code for a
// user without one) and gets a token; a node the user may not reach with
// the login is not found; a node without the requirement needs nothing.
func TestSessionMFAEndpoints(t *testing.T) {
	e := newMFAEnv(t)
	ctx := context.Background()
	require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: "strict"}, Spec: services.RoleSpec{
		Logins: []string{"root"}, NodeLabels: map[string]services.LabelValues{"env": {"prod"}}, RequireSessionMFA: true,
	}}))
	require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: "dev"}, Spec: services.RoleSpec{
		Logins: []string{"root"}, NodeLabels: map[string]services.LabelValues{"env": {"dev"}},
	}}))
	prod := services.Node{UUID: "11111111-1111-4111-8111-111111111111", Hostname: "db", Addr: "127.0.0.1:3022", Labels: map[string]string{"env": "prod"}, Cluster: "c1", Expires: e.clock.Now().Add(time.Hour)}
	dev := services.Node{UUID: "22222222-2222-4222-8222-222222222222", Hostname: "web", Addr: "127.0.0.1:3023", Labels: map[string]string{"env": "dev"}, Cluster: "c1", Expires: e.clock.Now().Add(time.Hour)}
	require.NoError(t, e.store.UpsertNode(ctx, prod))
	require.NoError(t, e.store.UpsertNode(ctx, dev))
	e.nodes.mu.Lock()
	e.nodes.nodes = []services.Node{prod, dev}
	e.nodes.mu.Unlock()

	// bob: a passkey.
	ws := e.passwordSession(t, "bob", bobPasswd)
	k := newSoftKey(t)
	e.register(t, ws, k, "key")
	_, err := e.auth.UpdateUser(ctx, "bob", []string{"strict", "dev"}, nil)
	require.NoError(t, err)
	full := e.fullSession(t, k)

	begin := func(ws webSession, node, login string) (int, []byte) {
		return e.do(t, http.MethodPost, "/webapi/mfa/session/begin", map[string]string{"node": node, "login": login}, ws)
	}
	code, body := begin(full, dev.UUID, "root")
	require.Equal(t, http.StatusOK, code, string(body))
	require.JSONEq(t, `{"required":false}`, string(body))
	code, body = begin(full, prod.UUID, "nobody")
	require.Equal(t, http.StatusNotFound, code, string(body))
	code, body = begin(full, prod.UUID, "root")
	require.Equal(t, http.StatusOK, code, string(body))
	var ch struct {
		Required bool `json:"required"`
		authapi.MFAChallenge
	}
	require.NoError(t, json.Unmarshal(body, &ch))
	require.True(t, ch.Required)
	code, body = e.do(t, http.MethodPost, "/webapi/mfa/session/finish", map[string]any{
		"node": prod.UUID, "login": "root", "challenge_id": ch.ChallengeID, "webauthn": json.RawMessage(k.get(t, ch.WebAuthn, mfaOrigin, "")),
	}, full)
	require.Equal(t, http.StatusOK, code, string(body))
	require.Contains(t, string(body), "mfa_token")

	// olga: a TOTP only. The page asks for a code.
	otpURL, err := e.auth.CreateUser(ctx, "olga", []byte("olga password 1"), nil, []string{"strict"}, true)
	require.NoError(t, err)
	u, err := url.Parse(otpURL)
	require.NoError(t, err)
	secret := u.Query().Get("secret")
	totpAt := func(at time.Time) string {
		c, err := totp.GenerateCode(secret, at)
		require.NoError(t, err)
		return c
	}
	code, body, cookies := e.doCookies(t, http.MethodPost, "/webapi/sessions", map[string]string{"user": "olga", "password": "olga password 1", "otp_token": totpAt(e.clock.Now())}, webSession{})
	require.Equal(t, http.StatusOK, code, string(body))
	var sess webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &sess))
	olga := webSession{token: sess.Token}
	for _, c := range cookies {
		if c.Name == SessionCookieName {
			olga.cookie = c
		}
	}
	code, body = begin(olga, prod.UUID, "root")
	require.Equal(t, http.StatusOK, code, string(body))
	require.JSONEq(t, `{"required":true,"otp":true}`, string(body))
	code, body = e.do(t, http.MethodPost, "/webapi/mfa/session/finish", map[string]any{"node": prod.UUID, "login": "root", "otp": totpAt(e.clock.Now())}, olga)
	require.Equal(t, http.StatusUnauthorized, code, "the login's code is spent: %s", body)
	code, body = e.do(t, http.MethodPost, "/webapi/mfa/session/finish", map[string]any{"node": prod.UUID, "login": "root", "otp": totpAt(e.clock.Now().Add(30 * time.Second))}, olga)
	require.Equal(t, http.StatusOK, code, string(body))
	require.Contains(t, string(body), "mfa_token")
}
