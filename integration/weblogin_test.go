package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// e2eScript is the path of a node script under e2e/, after checking that
// what it needs is there: node, Debian's chromium, playwright-core
// (npm ci in e2e/) and the web UI built into the binaries (make web).
func e2eScript(t *testing.T, name string) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		srvtest.SkipOrFailInCI(t, "node is not installed")
	}
	chromium := os.Getenv("CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		srvtest.SkipOrFailInCI(t, "chromium is not installed (%s)", chromium)
	}
	if _, err := os.Stat("../e2e/node_modules/playwright-core"); err != nil {
		srvtest.SkipOrFailInCI(t, "playwright-core is not installed: run npm ci in e2e/ (make e2e/node_modules/.package-lock.json)")
	}
	if _, err := os.Stat("../lib/web/ui/dist/index.html"); err != nil {
		srvtest.SkipOrFailInCI(t, "the web UI is not built into the binaries: run make web")
	}
	p, err := filepath.Abs(filepath.Join("..", "e2e", name))
	require.NoError(t, err)
	return p
}

// TestPshLoginAuthWeb: `psh login --auth web --browser none`, the real
// binary, completed in real Chromium with a passkey (the virtual
// authenticator): the user, who has no factor while passkeys are
// required, registers one in a register-only session, then logs in on the
// page psh printed with password and passkey and approves; psh gets its
// certificate through the sealed loopback hand-off and reaches the node.
func TestPshLoginAuthWeb(t *testing.T) {
	script := e2eScript(t, "pshweblogin.mjs")
	c := newAllInOne(t)
	e := newPshEnv(t, c)
	_, port, err := net.SplitHostPort(e.webAddr())
	require.NoError(t, err)
	// An IP address cannot be a WebAuthn RP id: the proxy is reached as
	// localhost, by psh and the browser alike.
	proxy := net.JoinHostPort("localhost", port)
	base := "https://" + proxy
	pref := filepath.Join(t.TempDir(), "pref.yaml")
	require.NoError(t, os.WriteFile(pref, []byte(fmt.Sprintf("kind: auth_preference\nspec:\n  second_factor: webauthn\n  webauthn:\n    rp_id: localhost\n    origins: [%q]\n", base)), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", pref)

	cmd, loginURL, stdout, stderr := pshBrowserLogin(t, e, proxy, "web")
	require.True(t, strings.HasPrefix(loginURL, base+"/web/cli-login?id="), "the URL is on the address psh was given: %s", loginURL)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := exec.CommandContext(ctx, "node", script)
	node.Env = append(os.Environ(), "BASE="+base, "PSH_URL="+loginURL, "LOGIN_USER=alice", "LOGIN_PASSWORD="+alicePassword, "ARTIFACTS="+t.TempDir())
	var out bytes.Buffer
	node.Stdout, node.Stderr = &out, &out
	require.NoError(t, node.Run(), "the browser's steps: %s", out.String())
	require.Contains(t, out.String(), "ok   log in on psh's page", "the browser did every step")
	require.NoError(t, cmd.Wait(), stderr())
	require.Contains(t, stdout.String(), `Logged in as alice to cluster "`+clusterName+`"`)

	// The certificate works: psh ssh to the node.
	require.Equal(t, "alice\n", e.mustRun(t, "", "ssh", c.login+"@"+c.hostname, "echo", "$SSH_POSTERN_USER"))
	// And the password alone in the terminal is refused: alice's factor
	// is a passkey now.
	e2 := newPshEnv(t, c)
	_, errOut, code := e2.run(t, alicePassword+"\n", "login", "--proxy", proxy, "--user", "alice", "--cacert", e2.caCert())
	require.Equal(t, 1, code)
	requireOneLineError(t, errOut, "invalid credentials")
}

// TestSessionMFAPasskeyThroughPsh: psh ssh to a node a require_session_mfa
// role reaches, confirmed with a passkey in the browser (Chromium, the
// virtual authenticator): an empty line at psh's OTP prompt prints the
// proxy's page, the test confirms there with the user's passkey, and the
// per-session certificate reaches psh through the sealed loopback
// hand-off. The passkey is registered and psh logged in on the same
// browser first (psh login --auth web).
func TestSessionMFAPasskeyThroughPsh(t *testing.T) {
	script := e2eScript(t, "pshweblogin.mjs")
	c := newAllInOne(t)
	e := newPshEnv(t, c)
	_, port, err := net.SplitHostPort(e.webAddr())
	require.NoError(t, err)
	proxy := net.JoinHostPort("localhost", port)
	base := "https://" + proxy
	dir := t.TempDir()
	pref := filepath.Join(dir, "pref.yaml")
	require.NoError(t, os.WriteFile(pref, []byte(fmt.Sprintf("kind: auth_preference\nspec:\n  second_factor: webauthn\n  webauthn:\n    rp_id: localhost\n    origins: [%q]\n", base)), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", pref)
	role := filepath.Join(dir, "role.yaml")
	require.NoError(t, os.WriteFile(role, []byte(fmt.Sprintf("kind: role\nversion: v1\nmetadata: {name: sensitive}\nspec:\n  logins: [%q]\n  node_labels: {\"*\": \"*\"}\n  require_session_mfa: true\n", c.login)), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", role)
	mustPctl(t, c.dataDir, "erin password 1\n", "users", "add", "erin", "--logins", c.login, "--roles", "sensitive")

	login, loginURL, loginOut, loginErr := pshBrowserLogin(t, e, proxy, "web")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node := exec.CommandContext(ctx, "node", script)
	node.Env = append(os.Environ(), "BASE="+base, "PSH_URL="+loginURL, "LOGIN_USER=erin", "LOGIN_PASSWORD=erin password 1", "ARTIFACTS="+t.TempDir(), "SESSION_URL_FROM_STDIN=1")
	toNode, err := node.StdinPipe()
	require.NoError(t, err)
	var out syncBuffer
	node.Stdout, node.Stderr = &out, &out
	require.NoError(t, node.Start())
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- node.Wait() }()
	require.NoError(t, login.Wait(), loginErr())
	require.Contains(t, loginOut.String(), "Logged in as erin")

	ssh, sessionURL, sshOut, sshErr := pshPrintsURL(t, e, "\n", "ssh", "--browser", "none", c.hostname, "echo", "confirmed-$((6*7))")
	require.True(t, strings.HasPrefix(sessionURL, base+"/web/cli-login?"), sessionURL)
	_, err = toNode.Write([]byte(sessionURL + "\n"))
	require.NoError(t, err)
	select {
	case err := <-nodeDone:
		require.NoError(t, err, "the browser's steps: %s", out.String())
	case <-ctx.Done():
		t.Fatalf("the browser's steps did not end: %s", out.String())
	}
	require.Contains(t, out.String(), "ok   confirm psh ssh's session with the passkey")
	require.NoError(t, ssh.Wait(), sshErr())
	require.Equal(t, "confirmed-42\n", sshOut.String())
}
