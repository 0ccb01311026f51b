package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
)

// joinNode starts a node-only process that joins c with a fresh token.
func (c *allInOne) joinNode(t *testing.T, name string, labels map[string]string) *service.Process {
	t.Helper()
	out := mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	cfg := procConfig(t.TempDir(), config.RoleNode)
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], name
	cfg.Labels = labels
	return startProcess(t, cfg)
}

// TestRoutingHidesInvisibleNodes is issue 10 item 9 as the attack: a user
// whose role reaches env=it only asks for names that nodes she may not see
// share. RBAC filters the candidates before routing, so the invisible node
// neither makes the name ambiguous, nor wins most_recent, nor appears
// (uuid, address, labels) in an ambiguous-host error on any path.
func TestRoutingHidesInvisibleNodes(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	// node-1 (env=it, the all-in-one) is visible; a second "node-1" with
	// env=secret is not; node-3 (env=it) shares node-1's address host.
	secret := c.joinNode(t, "node-1", map[string]string{"env": "secret", "codename": "bluebird"})
	third := c.joinNode(t, "node-3", map[string]string{"env": "it"})
	waitNodes(t, clt, 3)

	createRole(t, c.dataDir, fmt.Sprintf("kind: role\nmetadata: {name: it-only}\nspec:\n  logins: [%s]\n  node_labels: {env: it}\n", c.login))
	mustPctl(t, c.dataDir, "password-carol\n", "users", "add", "carol", "--logins", c.login, "--roles", "it-only")
	carol := issueCert(t, clt, "carol", 10*time.Minute).signer(t, nil)

	hostUUID := func(t *testing.T, target string) (string, error) {
		t.Helper()
		node, err := c.jumpWith(t, carol, c.login, target)
		if err != nil {
			return "", err
		}
		out, err := run(t, node, "echo $SSH_POSTERN_HOST_UUID")
		return strings.TrimSpace(out), err
	}
	noSecrets := func(t *testing.T, text string) {
		t.Helper()
		require.NotContains(t, text, secret.HostUUID())
		require.NotContains(t, text, "secret")
		require.NotContains(t, text, "bluebird")
		require.NotContains(t, text, secret.Addr(service.ListenerNode).String())
	}

	t.Run("one visible among duplicates routes", func(t *testing.T) {
		// The admin sees two node-1s.
		require.Eventually(t, func() bool {
			return strings.Count(routeOut(t, c), "node-1 ") >= 2
		}, 20*time.Second, 100*time.Millisecond)
		got, err := hostUUID(t, "node-1:0")
		require.NoError(t, err)
		require.Equal(t, c.p.HostUUID(), got)
	})

	t.Run("ambiguous error names visible nodes only", func(t *testing.T) {
		target := "127.0.0.1:0" // every node's address host
		var err error
		require.Eventually(t, func() bool {
			_, err = c.jumpWith(t, carol, c.login, target)
			return err != nil && strings.Contains(err.Error(), "matches 2 nodes")
		}, 20*time.Second, 100*time.Millisecond, "last: %v", err)
		msg := unquote(err.Error())
		require.Contains(t, msg, `ambiguous host "127.0.0.1" matches 2 nodes in cluster "it"`)
		require.Contains(t, msg, c.p.HostUUID())
		require.Contains(t, msg, third.HostUUID())
		noSecrets(t, msg)

		// The same through the proxy: subsystem, as psh and ProxyCommand
		// use it: stderr lists the same two.
		cfg := c.clientConfig(t)
		cfg.Auth = []ssh.AuthMethod{ssh.PublicKeys(carol)}
		proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
		require.NoError(t, err)
		defer proxy.Close()
		s, err := proxy.NewSession()
		require.NoError(t, err)
		defer s.Close()
		stderr, err := s.StderrPipe()
		require.NoError(t, err)
		_ = s.RequestSubsystem("proxy:" + target)
		b, _ := io.ReadAll(stderr)
		require.Contains(t, string(b), "matches 2 nodes", string(b))
		noSecrets(t, string(b))
	})

	t.Run("invisible only is not found", func(t *testing.T) {
		_, err := c.jumpWith(t, carol, c.login, secret.HostUUID()+":0")
		require.Error(t, err)
		require.Contains(t, unquote(err.Error()), fmt.Sprintf(`node %q not found in cluster "it"`, secret.HostUUID()))
	})

	t.Run("most_recent never picks the invisible node", func(t *testing.T) {
		nc, err := clt.GetClusterNetworkingConfig(context.Background())
		require.NoError(t, err)
		nc.Spec.RoutingStrategy = services.RoutingMostRecent
		require.NoError(t, clt.SetClusterNetworkingConfig(context.Background(), nc))
		// Both node-1s heartbeat; whichever did last, carol lands on the
		// one she may use, every time.
		for range 5 {
			got, err := hostUUID(t, "node-1:0")
			require.NoError(t, err)
			require.Equal(t, c.p.HostUUID(), got)
		}
		// And the admin view still sees both.
		require.GreaterOrEqual(t, strings.Count(routeOut(t, c), "node-1 "), 2)
	})
}

// routeOut is `pctl route node-1` as the admin sees it.
func routeOut(t *testing.T, c *allInOne) string {
	t.Helper()
	out, _, _ := pctl(t, c.dataDir, "", "route", "node-1")
	return out
}

// TestOpenSSHMixedCaseHost: OpenSSH lower-cases the host it is given, so
// `ssh -J proxy Web-Upper` opens direct-tcpip to "web-upper". Routing falls
// back to a case-insensitive match when the exact one finds nothing, so the
// node is reached, and with strict host-key checking: the host certificate
// also names the lower-cased "web-upper" that OpenSSH checks.
func TestOpenSSHMixedCaseHost(t *testing.T) {
	requireOpenSSH(t, "ssh")
	c := newAllInOneWith(t, func(cfg *config.Config) { cfg.NodeName = "Web-Upper" })
	c.hostname = "Web-Upper"
	cfg := c.opensshConfig(t, "")
	out, err := exec.Command("ssh", "-F", cfg, "Web-Upper", "echo $SSH_POSTERN_HOST_UUID").CombinedOutput()
	require.NoError(t, err, string(out))
	require.Equal(t, c.p.HostUUID()+"\n", string(out))

	// The exact case still routes, and so does x/crypto's lower-cased
	// direct-tcpip, as OpenSSH sends it.
	clt, err := c.viaJumpAs(t, "web-upper:0", c.p.HostUUID())
	require.NoError(t, err)
	got, err := run(t, clt, "echo $SSH_POSTERN_HOST_UUID")
	require.NoError(t, err)
	require.Equal(t, c.p.HostUUID()+"\n", got)
}

// viaJumpAs is viaJump with the node's host certificate checked against
// principal rather than the target's host.
func (c *allInOne) viaJumpAs(t *testing.T, target, principal string) (*ssh.Client, error) {
	t.Helper()
	cfg := c.clientConfig(t)
	proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	conn, err := proxy.Dial("tcp", target)
	if err != nil {
		return nil, err
	}
	sconn, chans, reqs, err := ssh.NewClientConn(conn, principal+":22", cfg)
	if err != nil {
		return nil, err
	}
	clt := ssh.NewClient(sconn, chans, reqs)
	t.Cleanup(func() { clt.Close() })
	return clt, nil
}

// TestPshNodeDiesMidSession: `psh ssh` exits 255 when its node dies, as
// OpenSSH does, and now says why in one line instead of nothing.
func TestPshNodeDiesMidSession(t *testing.T) {
	c := newAllInOne(t)
	b := c.joinNode(t, "second", map[string]string{"env": "it"})
	waitNodes(t, adminClient(t, c.dataDir, c.p), 2)
	e := newPshEnv(t, c)
	e.login(t, "alice", alicePassword+"\n")

	var cmd *exec.Cmd
	var stderr bytes.Buffer
	var lines *bufio.Reader
	require.Eventually(t, func() bool {
		// The proxy's NodeWatcher learns of the node through its watch.
		cmd = e.cmd("", "ssh", "second", "echo ready; exec sleep 600")
		stderr.Reset()
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		lines = bufio.NewReader(out)
		line, err := lines.ReadString('\n')
		if err == nil && line == "ready\n" {
			return true
		}
		_ = cmd.Wait()
		return false
	}, 20*time.Second, 100*time.Millisecond)

	// No grace at all (the context is already done): the node ends the
	// session at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = b.Shutdown(ctx)
	waited := make(chan error, 1)
	go func() {
		_, _ = io.Copy(io.Discard, lines)
		waited <- cmd.Wait()
	}()
	var err error
	select {
	case err = <-waited:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("psh outlived its node")
	}
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 255, exitErr.ExitCode())
	// The node, cut off at the end of its (zero) grace, says why on the
	// session's stderr; then psh says the connection is gone: one line
	// each.
	lines2 := strings.Split(strings.TrimSpace(strings.ReplaceAll(stderr.String(), "\r\n", "\n")), "\n")
	require.Len(t, lines2, 2, "stderr: %q", stderr.String())
	require.Equal(t, srv.MsgShuttingDown, lines2[0])
	require.True(t, strings.HasPrefix(lines2[1], "psh: connection to second lost"), "stderr: %q", stderr.String())
}
