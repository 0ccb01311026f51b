package integration

import (
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
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/utils"
)

// TestProxyIdentityCannotMintCerts is issue 10 item 3 as the attack: a
// real proxy process joined with an ordinary proxy token; whoever holds
// its data dir takes its identity and asks the auth API, over raw HTTPS,
// for a certificate for the cluster's admin user without a password. Auth
// refuses (403); the proxy's only way to a user certificate is the user's
// own password, which its web login presents.
func TestProxyIdentityCannotMintCerts(t *testing.T) {
	authDir := t.TempDir()
	a := startProcess(t, procConfig(authDir, config.RoleAuth))
	mustPctl(t, authDir, "admin-password-1\n", "users", "add", "admin", "--logins", "root", "--roles", "admin")
	m := joinRe.FindStringSubmatch(mustPctl(t, authDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleProxy)
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = a.Addr(service.ListenerAuth).String(), m[1], m[2], "edge-1"
	startProcess(t, cfg)
	id, err := auth.ReadIdentity(cfg.IdentityDir(auth.RoleProxy))
	require.NoError(t, err)

	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	body, err := json.Marshal(authapi.UserCertRequest{User: "admin", PublicKey: pub, TTL: time.Hour})
	require.NoError(t, err)
	tr := &http.Transport{TLSClientConfig: id.ClientTLSConfig()}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	authURL := "https://" + a.Addr(service.ListenerAuth).String()
	resp, err := hc.Post(authURL+"/v1/certs/user", "application/json", strings.NewReader(string(body)))
	require.NoError(t, err)
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, string(data))
	require.Contains(t, string(data), `may not call POST /v1/certs/user`)
	require.NotContains(t, string(data), "cert-v01@openssh.com")

	// The identity itself works (it is a real proxy's): reading the
	// inventory, as a proxy does, is allowed; so the 403 is the policy.
	resp, err = hc.Get(authURL + "/v1/nodes")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
