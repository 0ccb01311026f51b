package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/web"
)

// startProxy joins a proxy process to c's auth server with a proxy token.
func startProxy(t *testing.T, c *allInOne, name string) (*service.Process, string) {
	t.Helper()
	m := joinRe.FindStringSubmatch(mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleProxy)
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], name
	p := startProcess(t, cfg)
	// The proxy's NodeWatcher must know the node before a terminal routes.
	require.Eventually(t, func() bool {
		code, _ := readyz(t, p)
		return code == http.StatusOK
	}, 20*time.Second, 50*time.Millisecond)
	return p, dir
}

// browserAt is the same browser session (cookie and token) talking to
// the proxy whose web port is addr and whose self-signed certificate is
// in dataDir.
func browserAt(t *testing.T, wc *webTermClient, addr, dataDir string) *webTermClient {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dataDir, "web", web.SelfSignedCertFile))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(tr.CloseIdleConnections)
	return &webTermClient{addr: addr, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}, cookie: wc.cookie, token: wc.token}
}

// requireTerminalEnds reads ws until the server closes it, or fails.
func requireTerminalEnds(t *testing.T, ws *websocket.Conn, what string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var last string
	for {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			require.NoError(t, ctx.Err(), "%s: the terminal was not ended within 10s", what)
			return last
		}
		if f, err := webterm.DecodeFrame(msg); err == nil && f.Type == webterm.FrameError {
			last = string(f.Payload)
		}
	}
}

// TestHAWebSessionAnyProxy: three proxies on one auth server, the
// all-in-one's own (which reads the backend directly) and two joined
// ones (which reach it through the auth API). A browser logs in through
// proxy B, lists nodes and opens a terminal through A, B and C, and logs
// out through C: within seconds every terminal of the session ends on
// every proxy, and the session is refused on all of them. The secrets
// are checked wherever the session is adopted: the right cookie with a
// wrong token gets nothing on a proxy that has never seen the session.
func TestHAWebSessionAnyProxy(t *testing.T) {
	c := newAllInOne(t)
	pb, dirB := startProxy(t, c, "proxy-b")
	pc, dirC := startProxy(t, c, "proxy-c")
	addrA := c.p.Addr(service.ListenerWeb).String()
	addrB := pb.Addr(service.ListenerWeb).String()
	addrC := pc.Addr(service.ListenerWeb).String()

	// Log in through B: the record is created by auth, at login.
	login := webTermLogin(t, &allInOne{p: pb, dataDir: dirB, login: c.login, hostname: c.hostname})
	require.Equal(t, addrB, login.addr)
	atA := browserAt(t, login, addrA, c.dataDir)
	atB := login
	atC := browserAt(t, login, addrC, dirC)

	// A forged token with the real cookie, on a proxy that has not seen
	// the session yet: refused, and it does not adopt the session.
	forged := browserAt(t, login, addrC, dirC)
	forged.token = strings.Repeat("0", 64)
	code, body := webNodes(t, forged.hc, addrC, forged.cookie, forged.token)
	require.Equal(t, http.StatusUnauthorized, code, body)

	for name, b := range map[string]*webTermClient{"A": atA, "B": atB, "C": atC} {
		code, body := webNodes(t, b.hc, b.addr, b.cookie, b.token)
		require.Equal(t, http.StatusOK, code, "proxy %s: %s", name, body)
		require.Contains(t, body, c.hostname, "proxy %s", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wsA, _, _ := atA.open(t, ctx, c, "", "echo ON-$((40+1))\n", regexp.MustCompile(`ON-41`))
	wsB, _, _ := atB.open(t, ctx, c, "", "echo ON-$((40+2))\n", regexp.MustCompile(`ON-42`))
	wsC, _, _ := atC.open(t, ctx, c, "", "echo ON-$((40+3))\n", regexp.MustCompile(`ON-43`))

	// Log out through C.
	req, err := http.NewRequest(http.MethodDelete, "https://"+addrC+"/webapi/sessions", nil)
	require.NoError(t, err)
	req.AddCookie(&http.Cookie{Name: web.SessionCookieName, Value: login.cookie.Value})
	req.Header.Set("Authorization", "Bearer "+login.token)
	resp, err := atC.hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)

	for name, ws := range map[string]*websocket.Conn{"A": wsA, "B": wsB, "C": wsC} {
		msg := requireTerminalEnds(t, ws, "proxy "+name)
		t.Logf("proxy %s: terminal ended: %q", name, msg)
	}
	for name, b := range map[string]*webTermClient{"A": atA, "B": atB, "C": atC} {
		code, body := webNodes(t, b.hc, b.addr, b.cookie, b.token)
		require.Equal(t, http.StatusUnauthorized, code, "proxy %s after logout: %s", name, body)
	}
}
