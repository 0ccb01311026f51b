package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/web"
)

// webClientFrom is webClient with connections made from the local address
// ip (127.0.0.x): another source address for the login limiter.
func (c *allInOne) webClientFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(c.dataDir, "web", web.SelfSignedCertFile))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext:     func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) },
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// TestLockoutOfAnotherUserFails is issue 10 item 6 as the attack, over the
// proxy's web API: an attacker at 127.0.0.2 fails alice's password fifty
// times; alice, at 127.0.0.1, still logs in; the attacker's address stays
// locked; and an admin clears it with pctl users clear-lockout.
func TestLockoutOfAnotherUserFails(t *testing.T) {
	c := newAllInOne(t)
	webAddr := c.p.Addr(service.ListenerWeb).String()
	attacker, alice := c.webClientFrom(t, "127.0.0.2"), c.webClientFrom(t, "127.0.0.1")

	refused := 0
	for range 50 {
		status, body, err := postCerts(t, attacker, webAddr, "alice", "guess")
		require.NoError(t, err)
		require.Contains(t, []int{http.StatusUnauthorized, http.StatusTooManyRequests}, status, body)
		if status == http.StatusTooManyRequests {
			refused++
		}
	}
	require.Equal(t, 50-5, refused, "five guesses per (user, address), then 429")

	status, body, err := postCerts(t, alice, webAddr, "alice", "correct horse battery")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "the real user is not locked out: %s", body)
	status, body, err = postCerts(t, attacker, webAddr, "alice", "correct horse battery")
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, status, body)

	out := mustPctl(t, c.dataDir, "", "users", "clear-lockout", "alice", "--addr", "127.0.0.2")
	require.Contains(t, out, `Failed logins and lockouts of "alice" cleared.`)
	status, body, err = postCerts(t, attacker, webAddr, "alice", "correct horse battery")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, body)
}
