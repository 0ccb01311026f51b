package integration

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
)

// TestLeafSessionMFA: a leaf role with require_session_mfa, to which the
// root's role access is mapped. No cluster can issue a root user a
// per-session certificate for a leaf's node, so every way a root user
// reaches that node is refused, saying why: ssh -J and psh ssh through
// the root proxy, the root's web terminal, the leaf's own proxy and the
// node's port. A root user whose mapped role does not require it (bob) gets in.
func TestLeafSessionMFA(t *testing.T) {
	requireOpenSSH(t, "ssh")
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")
	mustPctl(t, root.dataDir, "", "create", "-f", writeRole(t, "dev"))
	guarded := filepath.Join(t.TempDir(), "guarded.yaml")
	require.NoError(t, os.WriteFile(guarded, []byte("kind: role\nmetadata: {name: guarded}\nspec: {logins: ['{{internal.logins}}'], node_labels: {'*': '*'}, require_session_mfa: true}\n"), 0o600))
	mustPctl(t, leaf.dataDir, "", "create", "-f", guarded)
	establishTrust(t, root, leaf, "[{remote: access, local: [guarded]}, {remote: dev, local: [access]}]")
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 30*time.Second, 100*time.Millisecond)

	kh := leafKnownHosts(t, root, leaf, "leaf")
	proxyAddr := root.p.Addr(service.ListenerProxySSH)
	alice := leafSSHConfig(t, proxyAddr, root.login, root.keyPath, kh, "leaf")
	bob := leafSSHConfig(t, proxyAddr, root.login, signedUser(t, root, "bob", "dev"), kh, "leaf")
	const why = `node "node-1" of cluster "leaf" requires a fresh second factor for each session (require_session_mfa)`

	t.Run("ssh -J through the root proxy", func(t *testing.T) {
		out, err := sshOut(t, alice, "node-1.leaf", "echo must-not-run")
		require.Error(t, err, out)
		require.NotContains(t, out, "must-not-run")
		require.Contains(t, jumpRefusal(t, alice, "node-1.leaf"), why)
		e := findEvent(t, leaf.dataDir, events.AccessDenied, func(e events.Event) bool {
			reason, _ := e.Fields[events.FieldReason].(string)
			return e.User == "alice" && strings.Contains(reason, "require_session_mfa")
		})
		require.Equal(t, "root", e.Fields[events.FieldUserCluster])

		out, err = sshOut(t, bob, "node-1.leaf", "echo $SSH_POSTERN_USER $SSH_POSTERN_CLUSTER_NAME")
		require.NoError(t, err, out)
		require.Equal(t, "bob leaf\n", out)
	})

	t.Run("psh ssh through the root proxy", func(t *testing.T) {
		e := newPshEnv(t, root)
		e.login(t, "alice", alicePassword+"\n")
		// Refused outright: no code is asked for, none could help.
		_, errOut, rc := e.run(t, "", "ssh", "node-1.leaf", "echo", "must-not-run")
		require.NotEqual(t, 0, rc)
		require.Contains(t, errOut, why)
		require.NotContains(t, errOut, "OTP code")
	})

	t.Run("the leaf's own proxy and the node's port", func(t *testing.T) {
		cfg := foreignClientConfig(t, root.login, root.keyPath, leaf.keyPath+".known_hosts")
		_, err := jumpWith(leaf, cfg, "node-1:0")
		require.ErrorContains(t, err, "fresh second factor")
		_, err = ssh.Dial("tcp", leaf.p.Addr(service.ListenerNode).String(), cfg)
		require.Error(t, err, "the leaf's node refuses a root user's session without a fresh factor")
	})

	t.Run("web terminal of the root", func(t *testing.T) {
		wc := webTermLogin(t, root)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := openLeafTerm(t, ctx, wc, webterm.TerminalParams{Host: "node-1", Login: root.login, Cols: 80, Rows: 24, Cluster: "leaf"},
			"echo must-not-run\n", regexp.MustCompile(`must-not-run\r?\n`))
		require.ErrorContains(t, err, why)
	})
}
