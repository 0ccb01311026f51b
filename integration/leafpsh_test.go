package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPshLeafCluster: a user logs in to the root with psh and reaches the
// leaf's node through the root proxy: `psh ls --cluster leaf`, `psh ssh
// --cluster leaf` and HOST.LEAF, and stock OpenSSH with `psh config`'s
// block with strict host key checking. Both clusters have a node called
// node-1: every answer must come from the leaf's. An unknown cluster is
// one plain line. The leaf's host CA vouches only for *.leaf: OpenSSH
// checking the leaf node's certificate (whose principals include the bare
// "node-1") under the root name node-1 refuses it. `pctl auth sign`
// writes the same scoped lines.
func TestPshLeafCluster(t *testing.T) {
	requireOpenSSH(t, "ssh")
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")
	establishTrust(t, root, leaf, "[{remote: access, local: [access]}]")
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 30*time.Second, 200*time.Millisecond)

	e := newPshEnv(t, root)
	e.login(t, "alice", alicePassword+"\n")
	known, err := os.ReadFile(filepath.Join(e.home, "known_hosts"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(known)), "\n")
	require.Len(t, lines, 2, string(known))
	require.True(t, strings.HasPrefix(lines[0], "@cert-authority * "), lines[0])
	require.True(t, strings.HasPrefix(lines[1], "@cert-authority *.leaf "), lines[1])
	require.Contains(t, e.mustRun(t, "", "status"), "Leaves:      leaf")

	t.Run("pctl auth sign", func(t *testing.T) {
		// A robot's known_hosts carries the leaf's host CA, scoped too.
		out := filepath.Join(t.TempDir(), "robot")
		mustPctl(t, root.dataDir, "", "auth", "sign", "--user", "alice", "--out", out)
		kh, err := os.ReadFile(out + ".known_hosts")
		require.NoError(t, err)
		require.Equal(t, string(known), string(kh), "the same lines psh login wrote")
	})

	t.Run("ls --cluster", func(t *testing.T) {
		var nodes []map[string]any
		out := e.mustRun(t, "", "ls", "--cluster", "leaf", "--format", "json")
		require.NoError(t, json.Unmarshal([]byte(out), &nodes), out)
		require.Len(t, nodes, 1, out)
		require.Equal(t, leaf.p.HostUUID(), nodes[0]["uuid"])
		require.Equal(t, "leaf", nodes[0]["cluster"])
		out = e.mustRun(t, "", "ls", "--format", "json")
		require.NoError(t, json.Unmarshal([]byte(out), &nodes), out)
		require.Len(t, nodes, 1, out)
		require.Equal(t, root.p.HostUUID(), nodes[0]["uuid"], "plain ls lists the root's own nodes")
	})

	t.Run("ssh --cluster", func(t *testing.T) {
		want := "leaf " + leaf.p.HostUUID() + "\n"
		cmd := "echo $SSH_POSTERN_CLUSTER_NAME $SSH_POSTERN_HOST_UUID"
		require.Equal(t, want, e.mustRun(t, "", "ssh", "--cluster", "leaf", "node-1", cmd))
		require.Equal(t, want, e.mustRun(t, "", "ssh", "--cluster", "leaf", leaf.login+"@"+leaf.p.HostUUID(), cmd), "by UUID")
		require.Equal(t, want, e.mustRun(t, "", "ssh", "node-1.leaf", cmd), "HOST.LEAF (rule 0)")
		require.Equal(t, "root "+root.p.HostUUID()+"\n", e.mustRun(t, "", "ssh", "node-1", cmd))
	})

	t.Run("unknown cluster", func(t *testing.T) {
		for _, args := range [][]string{{"ls", "--cluster", "nope"}, {"ssh", "--cluster", "nope", "node-1", "true"}} {
			_, errOut, code := e.run(t, "", args...)
			want := 1
			if args[0] == "ssh" {
				want = 255 // as OpenSSH: psh ssh never ran the command
			}
			require.Equal(t, want, code, errOut)
			requireOneLineError(t, errOut, `cluster "nope" not found`)
		}
		_, errOut, code := e.run(t, "", "proxy", "ssh", "--cluster", "nope", root.login+"@node-1:22")
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, `cluster "nope" not found`)
	})

	t.Run("OpenSSH with psh config", func(t *testing.T) {
		cfg := e.mustRun(t, "", "config")
		require.Contains(t, cfg, "Host *.root *.leaf ")
		require.Contains(t, cfg, "proxy ssh --cluster=leaf %r@%h:%p")
		require.Contains(t, cfg, "StrictHostKeyChecking yes")
		path := filepath.Join(t.TempDir(), "ssh_config")
		require.NoError(t, os.WriteFile(path, []byte(cfg+"Host *\n    GlobalKnownHostsFile /dev/null\n    BatchMode yes\n    LogLevel ERROR\n"), 0o600))
		ssh := func(args ...string) ([]byte, error) {
			cmd := exec.Command("ssh", append([]string{"-F", path}, args...)...)
			cmd.Env = withoutEnv(e.env(), "POSTERN_HOME")
			return output(cmd)
		}
		cmd := "echo via-openssh $SSH_POSTERN_CLUSTER_NAME $SSH_POSTERN_HOST_UUID"
		out, err := ssh(leaf.login+"@node-1.leaf", cmd)
		require.NoError(t, err, string(out))
		require.Equal(t, "via-openssh leaf "+leaf.p.HostUUID()+"\n", string(out))
		out, err = ssh(root.login+"@node-1.root", cmd)
		require.NoError(t, err, string(out))
		require.Equal(t, "via-openssh root "+root.p.HostUUID()+"\n", string(out))

		// The leaf's node checked under a root name: its certificate
		// names node-1, but the leaf's CA vouches for *.leaf only.
		out, err = ssh("-o", "HostKeyAlias=node-1", leaf.login+"@node-1.leaf", "echo must-not-run")
		require.Error(t, err, string(out))
		require.NotContains(t, string(out), "must-not-run")
		require.Contains(t, err.Error(), "Host key verification failed")
	})
}
