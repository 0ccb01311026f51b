package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/ssotest"
	"github.com/postern-dev/postern/lib/web"
)

// ssoEnv is an all-in-one cluster with a real OpenID provider (the
// zitadel example OP on loopback TLS) and an oidc_connector "corp" whose
// example.com accounts get a role with the test's OS login.
type ssoEnv struct {
	c   *allInOne
	op  *ssotest.Provider
	psh *pshEnv
}

func newSSOEnv(t *testing.T) *ssoEnv {
	t.Helper()
	return setupSSO(t, newAllInOne(t))
}

// setupSSO starts the provider, with the callbacks of c's proxy and of
// the proxies at redirectAddrs registered, and creates the role and the
// connector.
func setupSSO(t *testing.T, c *allInOne, redirectAddrs ...string) *ssoEnv {
	t.Helper()
	e := newPshEnv(t, c)
	redirects := []string{"https://" + e.webAddr() + web.SSOCallbackPath}
	for _, a := range redirectAddrs {
		redirects = append(redirects, "https://"+a+web.SSOCallbackPath)
	}
	op, err := ssotest.Start(ssotest.Config{Dir: t.TempDir(), RedirectURLs: redirects})
	require.NoError(t, err)
	t.Cleanup(op.Close)
	dir := t.TempDir()
	role := filepath.Join(dir, "role.yaml")
	require.NoError(t, os.WriteFile(role, []byte(fmt.Sprintf(`kind: role
version: v1
metadata: {name: sso-dev}
spec:
  logins: [%q]
  node_labels: {"*": "*"}
`, c.login)), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", role)
	conn := filepath.Join(dir, "connector.yaml")
	require.NoError(t, os.WriteFile(conn, []byte(fmt.Sprintf(`kind: oidc_connector
version: v1
metadata: {name: corp}
spec:
  display: Corp
  issuer_url: %q
  ca_file: %q
  client_id: %q
  client_secret: %q
  scopes: [email, profile]
  username_claim: email
  claims_to_roles:
  - {claim: email, value: "*@example.com", roles: [sso-dev]}
`, op.Issuer, op.CAFile, op.ClientID, op.ClientSecret)), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", conn)
	return &ssoEnv{c: c, op: op, psh: e}
}

// proxyClient trusts the self-signed web certificate in dataDir and does
// not follow redirects: the test follows them, as a browser would.
func proxyClient(t *testing.T, dataDir string) *http.Client {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dataDir, "web", web.SelfSignedCertFile))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	return &http.Client{
		Transport:     tr,
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// pshSSOLogin runs psh login --auth corp --browser none and returns the
// running command and the URL it printed.
func (s *ssoEnv) pshSSOLogin(t *testing.T, proxy string) (cmd *exec.Cmd, authURL string, stdout *strings.Builder, stderr func() string) {
	t.Helper()
	return pshBrowserLogin(t, s.psh, proxy, "corp")
}

// pshBrowserLogin runs psh login --auth auth --browser none and returns
// the running command and the URL it printed.
func pshBrowserLogin(t *testing.T, e *pshEnv, proxy, auth string) (cmd *exec.Cmd, authURL string, stdout *strings.Builder, stderr func() string) {
	t.Helper()
	return pshPrintsURL(t, e, "", "login", "--proxy", proxy, "--cacert", e.caCert(), "--auth", auth, "--browser", "none")
}

// pshPrintsURL runs psh with args and stdin until it prints the URL to
// open in a browser ("If the browser does not open, visit: URL").
func pshPrintsURL(t *testing.T, e *pshEnv, stdin string, args ...string) (cmd *exec.Cmd, authURL string, stdout *strings.Builder, stderr func() string) {
	t.Helper()
	cmd = e.cmd(stdin, args...)
	stdout = &strings.Builder{}
	cmd.Stdout = stdout
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string, 16)
	var all strings.Builder
	allDone := make(chan struct{})
	go func() {
		defer close(allDone)
		defer close(lines)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			all.WriteString(sc.Text() + "\n")
			lines <- sc.Text()
		}
	}()
	const prefix = "If the browser does not open, visit: "
	timeout := time.After(30 * time.Second)
	for authURL == "" {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "psh ended without printing the URL: %s", all.String())
			if _, u, ok := strings.Cut(l, prefix); ok {
				authURL = u
			}
		case <-timeout:
			t.Fatal("psh printed no URL")
		}
	}
	go func() {
		for range lines {
		}
	}()
	return cmd, authURL, stdout, func() string { <-allDone; return all.String() }
}

// finishAt plays the browser back from the provider: the callback on the
// proxy at addr (whose data dir holds its certificate), then wherever the
// proxy sends it.
func finishAt(t *testing.T, addr, dataDir, query string, cookies ...*http.Cookie) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+web.SSOCallbackPath+"?"+query, nil)
	require.NoError(t, err)
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := proxyClient(t, dataDir).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

func getBody(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestSSOPshLogin: psh login --auth with a real provider, its login page
// performed as a browser does; then psh ssh and ssh -J through psh config
// with the SSO user's certificate. A replay of the proxy's redirect finds
// nobody, and a replay of the provider's answer is told to start again.
func TestSSOPshLogin(t *testing.T) {
	s := newSSOEnv(t)
	e := s.psh
	ctx := context.Background()

	cmd, authURL, stdout, stderr := s.pshSSOLogin(t, e.webAddr())
	au, err := url.Parse(authURL)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(authURL, s.op.Issuer), authURL)
	require.Equal(t, "https://"+e.webAddr()+web.SSOCallbackPath, au.Query().Get("redirect_uri"), "the redirect URI names the proxy psh was given")

	query, err := s.op.Login(ctx, authURL, "alice", "verysecure")
	require.NoError(t, err)
	resp := finishAt(t, e.webAddr(), s.c.dataDir, query)
	require.Equal(t, http.StatusFound, resp.StatusCode)
	loopback := resp.Header.Get("Location")
	require.Regexp(t, `^http://127\.0\.0\.1:\d+/callback\?response=[A-Za-z0-9_-]+$`, loopback)
	code, page := getBody(t, loopback)
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, "Logged in, you can close this tab")
	require.NoError(t, cmd.Wait(), stderr())
	require.Contains(t, stdout.String(), `Logged in as alice@example.com to cluster "`+clusterName+`"`)

	// The result was taken: its listener is gone.
	_, err = http.Get(loopback)
	require.Error(t, err, "the loopback listener stopped after its one result")
	// The provider's answer again: the state was used.
	resp, err = proxyClient(t, s.c.dataDir).Get("https://" + e.webAddr() + web.SSOCallbackPath + "?" + query)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, string(body), "already used or has expired: start again")

	out := e.mustRun(t, "", "status")
	require.Contains(t, out, "User:        alice@example.com")
	require.Contains(t, out, "Roles:       sso-dev")
	out = e.mustRun(t, "", "ssh", "node-1", "echo sso $SSH_POSTERN_USER")
	require.Equal(t, "sso alice@example.com\n", out)

	t.Run("ssh -J through psh config", func(t *testing.T) {
		requireOpenSSH(t, "ssh")
		cfg := e.mustRun(t, "", "config")
		alias := clusterName + "-proxy"
		keyFile := filepath.Join(e.home, "keys", e.webAddr(), "alice@example.com")
		require.FileExists(t, keyFile)
		nodeBlock := fmt.Sprintf("Host node-1\n    ProxyJump %s\n    IdentityFile %s\n    CertificateFile %s-cert.pub\n    IdentitiesOnly yes\n    UserKnownHostsFile %s\n",
			alias, keyFile, keyFile, filepath.Join(e.home, "known_hosts"))
		path := filepath.Join(t.TempDir(), "ssh_config")
		require.NoError(t, os.WriteFile(path, []byte(cfg+nodeBlock+"Host *\n    StrictHostKeyChecking yes\n    GlobalKnownHostsFile /dev/null\n    BatchMode yes\n    LogLevel ERROR\n"), 0o600))
		ssh := exec.Command("ssh", "-F", path, s.c.login+"@node-1", "echo via-openssh $SSH_POSTERN_USER")
		ssh.Env = withoutEnv(e.env(), "POSTERN_HOME")
		out, err := output(ssh)
		require.NoError(t, err, string(out))
		require.Equal(t, "via-openssh alice@example.com\n", string(out))
	})

	t.Run("an account that maps to no role", func(t *testing.T) {
		cmd, authURL, _, stderr := s.pshSSOLogin(t, e.webAddr())
		query, err := s.op.Login(ctx, authURL, "mallory", "verysecure")
		require.NoError(t, err)
		resp, err := proxyClient(t, s.c.dataDir).Get("https://" + e.webAddr() + web.SSOCallbackPath + "?" + query)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode)
		require.Contains(t, string(body), "your identity provider account maps to no Postern role")
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		_ = stderr()
	})
}

// TestSSOLoginAcrossProxies: a login started on one proxy is finished by
// another (a load balancer sent the browser's return there): what links
// the two halves is in the backend, and the second proxy reaches auth
// over the API.
func TestSSOLoginAcrossProxies(t *testing.T) {
	c := newAllInOne(t)
	b, bDir := startProxy(t, c, "proxy-b")
	bAddr := b.Addr(service.ListenerWeb).String()
	s := setupSSO(t, c, bAddr)
	op := s.op

	cmd, authURL, stdout, stderr := s.pshSSOLogin(t, s.psh.webAddr())
	query, err := op.Login(context.Background(), authURL, "alice", "verysecure")
	require.NoError(t, err)
	resp := finishAt(t, bAddr, bDir, query)
	require.Equal(t, http.StatusFound, resp.StatusCode)
	code, page := getBody(t, resp.Header.Get("Location"))
	require.Equal(t, http.StatusOK, code, page)
	require.NoError(t, cmd.Wait(), stderr())
	require.Contains(t, stdout.String(), "Logged in as alice@example.com")
	out := s.psh.mustRun(t, "", "ssh", "node-1", "echo across")
	require.Equal(t, "across\n", out)

	// A browser login started on B finishes on A, and the session works
	// on both.
	jar := proxyClient(t, bDir)
	resp, err = jar.Get("https://" + bAddr + "/webapi/oidc/login/web?connector=corp&return_to=" + url.QueryEscape("/web/cluster/"+clusterName+"/node/x/y"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusFound, resp.StatusCode)
	// The browser carries the cookie that binds the login to it (one name
	// in front of both proxies, in production).
	binding := resp.Cookies()
	require.NotEmpty(t, binding)
	query, err = op.Login(context.Background(), resp.Header.Get("Location"), "alice", "verysecure")
	require.NoError(t, err)
	resp = finishAt(t, s.psh.webAddr(), c.dataDir, query, binding...)
	require.Equal(t, http.StatusFound, resp.StatusCode)
	require.Equal(t, "/web/cluster/"+clusterName+"/node/x/y", resp.Header.Get("Location"))
	var cookie *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == web.SessionCookieName {
			cookie = ck
		}
	}
	require.NotNil(t, cookie)
	for _, at := range []struct{ addr, dir string }{{s.psh.webAddr(), c.dataDir}, {bAddr, bDir}} {
		req, err := http.NewRequest(http.MethodPost, "https://"+at.addr+"/webapi/sessions/token", nil)
		require.NoError(t, err)
		req.AddCookie(cookie)
		resp, err := proxyClient(t, at.dir).Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", at.addr, body)
		require.Contains(t, string(body), `"user":"alice@example.com"`)
	}
}
