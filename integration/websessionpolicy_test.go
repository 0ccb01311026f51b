package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
)

// TestProxyIdentityCannotActOnOthersWebSessions is the attack of whoever
// holds a joined proxy's data dir on a web session that a browser opened
// through another proxy: with the proxy's identity, over raw HTTPS to the
// auth API, reading, touching and deleting the session by its key, and
// watching every session's key, are refused (403) and audited
// (api.denied); the key in place of the session id finds nothing (404);
// the session goes on working. Only with the secrets the browser holds
// can the proxy act on it: deleting with them logs the browser out.
func TestProxyIdentityCannotActOnOthersWebSessions(t *testing.T) {
	c := newAllInOne(t)
	_, dirB := startProxy(t, c, "proxy-b")
	login := webTermLogin(t, c) // through the all-in-one's proxy, not B
	addrA := c.p.Addr(service.ListenerWeb).String()
	h := sha256.Sum256([]byte(login.cookie.Value))
	key := hex.EncodeToString(h[:])

	id, err := auth.ReadIdentity(procConfig(dirB, config.RoleProxy).IdentityDir(auth.RoleProxy))
	require.NoError(t, err)
	tr := &http.Transport{TLSClientConfig: id.ClientTLSConfig()}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	authURL := "https://" + c.p.Addr(service.ListenerAuth).String()
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, authURL+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}

	byKey := map[string][2]string{
		"GET /v1/websessions/{key}":        {http.MethodGet, "/v1/websessions/" + key},
		"POST /v1/websessions/{key}/touch": {http.MethodPost, "/v1/websessions/" + key + "/touch"},
		"DELETE /v1/websessions/{key}":     {http.MethodDelete, "/v1/websessions/" + key},
		"GET /v1/watch/websessions":        {http.MethodGet, "/v1/watch/websessions"},
	}
	for endpoint, r := range byKey {
		status, body := do(r[0], r[1], `{"last_active":"2030-01-01T00:00:00Z"}`)
		require.Equal(t, http.StatusForbidden, status, "%s: %s", endpoint, body)
		require.Contains(t, body, "may not call "+endpoint)
		require.NotContains(t, body, "alice")
	}
	ref := func(sid, token string) string {
		b, err := json.Marshal(authapi.WebSessionRequest{SessionID: sid, Token: token})
		require.NoError(t, err)
		return string(b)
	}
	status, body := do(http.MethodPost, "/v1/websessions/delete", ref(key, login.token))
	require.Equal(t, http.StatusNotFound, status, body)

	code, body := webNodes(t, login.hc, addrA, login.cookie, login.token)
	require.Equal(t, http.StatusOK, code, "the session survived the attempts: %s", body)
	require.Eventually(t, func() bool {
		seen := map[string]bool{}
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.APIDenied && e.Fields[events.FieldRole] == auth.RoleProxy {
				if ep, _ := e.Fields[events.FieldEndpoint].(string); ep != "" {
					seen[ep] = true
				}
			}
		}
		for endpoint := range byKey {
			if !seen[endpoint] {
				return false
			}
		}
		return true
	}, 10*time.Second, 100*time.Millisecond, "every by-key attempt is audited as api.denied")

	// With the browser's secrets the proxy acts: this is a logout.
	status, body = do(http.MethodPost, "/v1/websessions/delete", ref(login.cookie.Value, login.token))
	require.Equal(t, http.StatusOK, status, body)
	require.Eventually(t, func() bool {
		code, _ := webNodes(t, login.hc, addrA, login.cookie, login.token)
		return code == http.StatusUnauthorized
	}, 10*time.Second, 50*time.Millisecond, "the deleted session is refused on the proxy that served it")
}
