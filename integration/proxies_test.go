package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/user"
	"path/filepath"
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

// TestTunnelToEveryProxyAndMoveBeforeBreak: a node joined through proxy
// edge-1 learns edge-2 from the announcements once edge-2 heartbeats,
// and keeps a tunnel to each (edge-2's at the address in its record).
// On SIGTERM of edge-1 (a graceful shutdown) its agents are asked to
// move first: the node stays reachable through edge-2 the whole time, a
// session running through edge-1 goes on until it ends, and then
// edge-1's tunnel is gone and edge-1 leaves the proxy list.
func TestTunnelToEveryProxyAndMoveBeforeBreak(t *testing.T) {
	authDir := t.TempDir()
	a := startProcess(t, procConfig(authDir, config.RoleAuth))
	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, authDir, alicePassword+"\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, authDir, "", "auth", "sign", "--user", "alice", "--ttl", "10m", "--out", keyPath)
	cfg := (&allInOne{p: a, dataDir: authDir, login: u.Username, keyPath: keyPath}).clientConfig(t)
	clt := adminClient(t, authDir, a)

	p1, _ := startRemoteProxy(t, authDir, a, "edge-1")
	startNATNodeVia(t, authDir, p1.Addr(service.ListenerWeb).String(), "multi")
	waitTunnels(t, p1, 1, 20*time.Second, "the node's tunnel to edge-1")
	p2, _ := startRemoteProxy(t, authDir, a, "edge-2")
	waitProxies(t, clt, 2)
	waitTunnels(t, p2, 1, 20*time.Second, "the node discovers edge-2 and opens a tunnel to it")
	require.Equal(t, 1.0, metric(getMetrics(t, p1), "postern_tunnels"), "one tunnel per proxy")

	via := func(p *service.Process) error {
		sc, err := jumpVia(t, cfg, p.Addr(service.ListenerProxySSH).String(), "multi:22")
		if err != nil {
			return err
		}
		defer sc.Close()
		out, err := run(t, sc, "echo ok")
		if err == nil && out != "ok\n" {
			err = fmt.Errorf("got %q", out)
		}
		return err
	}
	require.NoError(t, via(p1))
	require.NoError(t, via(p2))

	// A session through edge-1 that outlives its SIGTERM.
	sc, err := jumpVia(t, cfg, p1.Addr(service.ListenerProxySSH).String(), "multi:22")
	require.NoError(t, err)
	ls := startLineSession(t, sc, "sh")
	out, err := ls.roundTrip("echo one")
	require.NoError(t, err)
	require.Equal(t, "one\n", out)

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p1.Shutdown(ctx)
	}()
	// edge-1 leaves the list at once; the node is reachable via edge-2
	// throughout; the running session goes on.
	waitProxies(t, clt, 1)
	for range 3 {
		require.NoError(t, via(p2))
	}
	out, err = ls.roundTrip("echo two")
	require.NoError(t, err, "the session on the moving tunnel goes on")
	require.Equal(t, "two\n", out)
	ls.s.Close()
	sc.Close()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("edge-1 did not finish its shutdown")
	}
	// The node's auth watches rode edge-1's tunnel and re-sync through
	// edge-2 (failing closed meanwhile): a cross-process condition.
	require.Eventually(t, func() bool { return via(p2) == nil }, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, 1.0, metric(getMetrics(t, p2), "postern_tunnels"))
}
