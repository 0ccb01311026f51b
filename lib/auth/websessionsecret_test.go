package auth

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// TestProxyActsOnlyOnPresentedWebSessions is the attack of a proxy
// identity (over raw HTTPS, as whoever copied a proxy's data dir holds
// it) on another user's web session: by its key, reading, touching and
// deleting are refused (403, audited as api.denied), as is the watch
// that streamed every session's key; the key in place of the session id
// finds nothing (404), a wrong token is refused and audited; the watch of
// ends carries neither the key nor the id. With the two secrets the
// browser presented, the proxy reads, touches and deletes the session.
func TestProxyActsOnlyOnPresentedWebSessions(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "bob", []byte("correct horse battery"), []string{"bob"}, nil, false)
	require.NoError(t, err)
	proxyID := env.identity(t, "proxy-1", RoleProxy)
	proxy := env.client(t, proxyID)

	sid, token := "bobs-session-id-secret", "bobs-bearer-token-secret"
	key := webSessionKeyOf(sid)
	th := sha256.Sum256([]byte(token))
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	_, err = proxy.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{
		AuthRequest: authapi.AuthRequest{User: "bob", Password: "correct horse battery"},
		PublicKey:   pub, TTL: time.Hour,
		WebSession: &authapi.WebSessionInit{Key: key, TokenHash: th[:]},
	})
	require.NoError(t, err)

	tlsCfg := proxyID.ClientTLSConfig().Clone()
	tlsCfg.ServerName = AuthServerName
	tlsCfg.Time = env.clock.Now
	tr := &http.Transport{TLSClientConfig: tlsCfg}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, "https://"+env.addr+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}

	// By key: refused to the proxy's role, and audited.
	for _, c := range []struct{ method, path, endpoint string }{
		{http.MethodGet, "/v1/websessions/" + key, "GET /v1/websessions/{key}"},
		{http.MethodPost, "/v1/websessions/" + key + "/touch", "POST /v1/websessions/{key}/touch"},
		{http.MethodDelete, "/v1/websessions/" + key, "DELETE /v1/websessions/{key}"},
		{http.MethodGet, "/v1/watch/websessions", "GET /v1/watch/websessions"},
	} {
		status, body := do(c.method, c.path, `{"last_active":"2030-01-01T00:00:00Z"}`)
		require.Equal(t, http.StatusForbidden, status, "%s: %s", c.endpoint, body)
		require.Contains(t, body, "may not call "+c.endpoint)
		require.NotContains(t, body, "bob")
		e := waitEvent(t, rec, events.APIDenied, func(e events.Event) bool { return e.Fields[events.FieldEndpoint] == c.endpoint })
		require.Equal(t, "proxy-1", e.Fields[events.FieldServerID])
		require.Equal(t, RoleProxy, e.Fields[events.FieldRole])
	}

	// The key where the session id goes names nothing; a wrong token is
	// refused and audited.
	asJSON := func(r authapi.WebSessionRequest) string {
		b, err := json.Marshal(r)
		require.NoError(t, err)
		return string(b)
	}
	for _, path := range []string{"/v1/websessions/get", "/v1/websessions/touch", "/v1/websessions/delete"} {
		status, body := do(http.MethodPost, path, asJSON(authapi.WebSessionRequest{SessionID: key, Token: token}))
		require.Equal(t, http.StatusNotFound, status, "%s: %s", path, body)
		require.NotContains(t, body, "bob")
		status, body = do(http.MethodPost, path, asJSON(authapi.WebSessionRequest{SessionID: sid, Token: "guess"}))
		require.Equal(t, http.StatusForbidden, status, "%s: %s", path, body)
		require.NotContains(t, body, "bob")
		e := waitEvent(t, rec, events.APIDenied, func(e events.Event) bool { return e.Fields[events.FieldEndpoint] == "POST "+path })
		require.Equal(t, "proxy-1", e.Fields[events.FieldServerID])
		require.Contains(t, e.Fields[events.FieldReason], "token does not match")
	}
	_, err = env.store.GetWebSession(ctx, key)
	require.NoError(t, err, "none of that touched the record")

	// The watch of ends, read raw: nothing of the session until it ends,
	// then its end id, never its key or id.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(wctx, http.MethodGet, "https://"+env.addr+"/v1/watch/websessions/ended", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := bufio.NewScanner(resp.Body)
	readEvent := func() authapi.WatchEvent {
		t.Helper()
		require.True(t, lines.Scan(), "watch stream ended: %v", lines.Err())
		line := lines.Text()
		require.NotContains(t, line, key)
		require.NotContains(t, line, sid)
		var we authapi.WatchEvent
		require.NoError(t, json.Unmarshal([]byte(line), &we))
		return we
	}
	require.Equal(t, "init", readEvent().Type)

	// With the browser's two secrets the proxy acts on the session.
	status, body := do(http.MethodPost, "/v1/websessions/get", asJSON(authapi.WebSessionRequest{SessionID: sid, Token: token}))
	require.Equal(t, http.StatusOK, status, body)
	var ws services.WebSession
	require.NoError(t, json.Unmarshal([]byte(body), &ws))
	require.Equal(t, "bob", ws.User)
	status, body = do(http.MethodPost, "/v1/websessions/touch", asJSON(authapi.WebSessionRequest{SessionID: sid, Token: token, LastActive: env.clock.Now()}))
	require.Equal(t, http.StatusOK, status, body)
	status, body = do(http.MethodPost, "/v1/websessions/delete", asJSON(authapi.WebSessionRequest{SessionID: sid, Token: token}))
	require.Equal(t, http.StatusOK, status, body)
	ended := readEvent()
	require.Equal(t, "delete", ended.Type)
	require.Equal(t, services.WebSessionsPrefix()+services.WebSessionEndID(key), ended.Key)
	status, _ = do(http.MethodPost, "/v1/websessions/get", asJSON(authapi.WebSessionRequest{SessionID: sid, Token: token}))
	require.Equal(t, http.StatusNotFound, status)
}
