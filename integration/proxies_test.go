package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// startRemoteProxy joins a proxy-only process to the auth server a with a
// proxy token.
func startRemoteProxy(t *testing.T, authDir string, a *service.Process, name string) (*service.Process, *config.Config) {
	t.Helper()
	m := joinRe.FindStringSubmatch(mustPctl(t, authDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	cfg := procConfig(t.TempDir(), config.RoleProxy)
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = a.Addr(service.ListenerAuth).String(), m[1], m[2], name
	return startProcess(t, cfg), cfg
}

func waitProxies(t *testing.T, clt *auth.Client, want int) []services.Proxy {
	t.Helper()
	var got []services.Proxy
	require.Eventually(t, func() bool {
		var err error
		got, err = clt.GetProxies(context.Background())
		return err == nil && len(got) == want
	}, 20*time.Second, 50*time.Millisecond, "want %d proxies, have %v", want, got)
	return got
}

// TestProxiesHeartbeat: two proxy processes sharing one auth server each
// heartbeat their own `proxy` record (with the addresses others dial),
// `pctl proxies ls` lists both, a proxy may not announce another (the
// attack: a raw HTTPS client with proxy A's identity writing B's record)
// and a node may not announce a proxy at all; a proxy that shuts down
// leaves the list at once.
func TestProxiesHeartbeat(t *testing.T) {
	authDir := t.TempDir()
	a := startProcess(t, procConfig(authDir, config.RoleAuth))
	p1, cfg1 := startRemoteProxy(t, authDir, a, "edge-1")
	p2, _ := startRemoteProxy(t, authDir, a, "edge-2")
	clt := adminClient(t, authDir, a)

	got := waitProxies(t, clt, 2)
	byUUID := map[string]services.Proxy{}
	for _, p := range got {
		byUUID[p.UUID] = p
	}
	for _, p := range []*service.Process{p1, p2} {
		rec, ok := byUUID[p.HostUUID()]
		require.True(t, ok, "proxy %s in %v", p.HostUUID(), got)
		require.Equal(t, p.Addr(service.ListenerTunnel).String(), rec.TunnelAddr)
		require.Equal(t, p.Addr(service.ListenerProxySSH).String(), rec.SSHAddr)
		require.Equal(t, p.Addr(service.ListenerWeb).String(), rec.WebAddr)
		require.Equal(t, clusterName, rec.Cluster)
		require.WithinDuration(t, time.Now(), rec.LastHeartbeat, time.Minute)
		require.True(t, rec.Expires.After(rec.LastHeartbeat))
	}
	out := mustPctl(t, authDir, "", "proxies", "ls")
	require.Contains(t, out, "edge-1")
	require.Contains(t, out, "edge-2")
	require.Contains(t, out, p1.Addr(service.ListenerTunnel).String())

	put := func(t *testing.T, identityDir string, rec services.Proxy) (int, string) {
		id, err := auth.ReadIdentity(identityDir)
		require.NoError(t, err)
		body, err := json.Marshal(rec)
		require.NoError(t, err)
		tr := &http.Transport{TLSClientConfig: id.ClientTLSConfig()}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodPut, "https://"+a.Addr(service.ListenerAuth).String()+"/v1/proxies", strings.NewReader(string(body)))
		require.NoError(t, err)
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	t.Run("a proxy announces only itself", func(t *testing.T) {
		forged := byUUID[p2.HostUUID()]
		forged.TunnelAddr = "203.0.113.9:3024"
		status, body := put(t, cfg1.IdentityDir(auth.RoleProxy), forged)
		require.Equal(t, http.StatusForbidden, status, body)
		require.Contains(t, body, "may not announce proxy")
		cur := waitProxies(t, clt, 2)
		for _, p := range cur {
			require.NotEqual(t, "203.0.113.9:3024", p.TunnelAddr)
		}
	})
	t.Run("a node may not announce a proxy", func(t *testing.T) {
		token, pin := nodeToken(t, authDir)
		ncfg := procConfig(t.TempDir(), config.RoleNode)
		ncfg.AuthServer, ncfg.Token, ncfg.CAPin, ncfg.NodeName = a.Addr(service.ListenerAuth).String(), token, pin, "n1"
		n := startProcess(t, ncfg)
		status, body := put(t, ncfg.IdentityDir(auth.RoleNode), services.Proxy{UUID: n.HostUUID(), TunnelAddr: "203.0.113.9:3024"})
		require.Equal(t, http.StatusForbidden, status, body)
		require.Contains(t, body, "may not call PUT /v1/proxies")
	})
	t.Run("a proxy that stops leaves the list", func(t *testing.T) {
		stopProcess(t, p2)
		left := waitProxies(t, clt, 1)
		require.Equal(t, p1.HostUUID(), left[0].UUID)
	})
}
