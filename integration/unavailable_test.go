package integration

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/service"
)

// sshBanner dials addr with the `pctl auth sign` certificate and returns
// the authentication banners the server sent, and the dial's error.
func (c *allInOne) sshBanner(t *testing.T, addr string) (string, error) {
	t.Helper()
	cfg := c.clientConfig(t)
	var mu sync.Mutex
	var banner strings.Builder
	cfg.BannerCallback = func(msg string) error {
		mu.Lock()
		defer mu.Unlock()
		banner.WriteString(msg)
		return nil
	}
	clt, err := ssh.Dial("tcp", addr, cfg)
	if err == nil {
		clt.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	return banner.String(), err
}

// requireAuthUnavailableEverywhere is issue 10 item 13: with the backend
// down, every way in says that the auth server (or its backend) is
// unavailable (SSH aside: see below), instead of "answered 500:
// internal error" or a raw "disk I/O error". The checks run in parallel:
// against a backend that hangs (etcd stopped) each waits out its bound.
// Each of also runs as one more parallel check.
func requireAuthUnavailableEverywhere(t *testing.T, c *allInOne, also ...func(t *testing.T)) {
	t.Run("unavailable", func(t *testing.T) {
		for _, f := range also {
			t.Run("login", func(t *testing.T) {
				t.Parallel()
				f(t)
			})
		}
		t.Run("pctl", func(t *testing.T) {
			t.Parallel()
			_, errOut, err := pctl(t, c.dataDir, "", "users", "ls")
			require.Error(t, err)
			t.Logf("pctl: %s", errOut)
			requireOneLineError(t, errOut, "the auth server's backend is unavailable")
		})
		t.Run("psh login", func(t *testing.T) {
			t.Parallel()
			e := newPshEnv(t, c)
			_, errOut, code := e.run(t, "correct horse battery\n", "login", "--proxy", e.webAddr(), "--user", "alice", "--cacert", e.caCert())
			require.NotEqual(t, 0, code)
			t.Logf("psh: %s", errOut)
			requireOneLineError(t, errOut, "login failed: the auth server is unavailable; try again later")
		})
		t.Run("web session", func(t *testing.T) {
			t.Parallel()
			hc := c.webClient(t)
			resp, err := hc.Post("https://"+c.p.Addr(service.ListenerWeb).String()+"/webapi/sessions", "application/json",
				strings.NewReader(`{"user":"alice","password":"correct horse battery","otp_token":""}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body.String())
			require.Contains(t, body.String(), "the auth server is unavailable; try again later")
		})
		// SSH is the exception, by design (issue 17): the proxy and the
		// node check certificates and roles against their in-memory view
		// (services.AccessCache), pushed by the backend's watch, so a
		// backend outage does not lock out users whose access nothing
		// could have changed (no role, user or lock can be written while
		// the backend is down). The "auth server is unavailable" banner
		// remains for a server whose view is not loaded or whose watch
		// broke (lib/srv's unavailable tests).
		for _, l := range []string{service.ListenerProxySSH, service.ListenerNode} {
			t.Run("ssh from memory "+l, func(t *testing.T) {
				t.Parallel()
				banner, err := c.sshBanner(t, c.p.Addr(l).String())
				require.NoError(t, err)
				require.Empty(t, banner)
			})
		}
	})
}

// TestFaultSQLiteBackendUnavailable breaks the SQLite file under a running
// all-in-one process (overwritten in place, as a failing disk or a stray
// process would): users with valid certificates, psh, the web API and
// pctl are all told that the auth server is unavailable.
func TestFaultSQLiteBackendUnavailable(t *testing.T) {
	c := newAllInOne(t)
	clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
	require.NoError(t, err)
	got, err := run(t, clt, "echo before")
	require.NoError(t, err)
	require.Equal(t, "before\n", got)

	path := filepath.Join(c.dataDir, "backend", "postern.db")
	// In place, all three files: the WAL index (-shm) too, or a reader
	// with a warm page cache would not notice.
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		require.NoError(t, os.WriteFile(p, bytes.Repeat([]byte("garbage!"), 4096), 0o600))
	}
	requireAuthUnavailableEverywhere(t, c)
}
