package integration

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// TestLeafInNetworkNamespace: a leaf cluster (one postern process with
// auth, proxy and node) runs in a network namespace nothing can connect
// into; the root runs on the host. Trust is established from inside
// (`pctl create -f` in the namespace: the leaf's auth reaches the root's
// auth only through the root proxy's web port) and the leaf's proxy
// keeps its tunnel to the root (the root shows it online), while the
// leaf's own ports get no answer from the host.
func TestLeafInNetworkNamespace(t *testing.T) {
	ns := newNetNS(t)
	root := newAllInOneWith(t, func(cfg *config.Config) {
		cfg.ClusterName = "root"
		cfg.WebAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.TunnelAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.PublicAddrs = []string{ns.hostIP}
	})

	dir := t.TempDir()
	leaf := &nsNode{dataDir: dir, stderr: &syncBuffer{}}
	leaf.start(t, ns, []string{"start", "--roles", "auth,proxy,node", "--cluster-name", "leaf", "--data-dir", dir,
		"--nodename", "leaf-node", "--diag-addr", "127.0.0.1:0"})
	nsPctl := func(args ...string) (string, error) {
		cmd := ns.command(bin("pctl"), append([]string{"--data-dir", dir}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	require.Eventually(t, func() bool {
		_, err := nsPctl("nodes", "ls")
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the leaf never came up:\n%s", leaf.stderr)

	path := filepath.Join(t.TempDir(), "trusted_cluster.yaml")
	_, webPort, err := net.SplitHostPort(root.p.Addr(service.ListenerWeb).String())
	require.NoError(t, err)
	body := "kind: trusted_cluster\nmetadata: {name: root}\nspec:\n  enabled: true\n  proxy_addr: " +
		net.JoinHostPort(ns.hostIP, webPort) + "\n  token: " + trustToken(t, root) + "\n  role_map: [{remote: access, local: [access]}]\n"
	require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
	out, err := nsPctl("create", "-f", path)
	require.NoError(t, err, out)
	require.Contains(t, out, `trusted_cluster "root" saved`)

	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 30*time.Second, 200*time.Millisecond,
		"the leaf's tunnel never reached the root; its log:\n%s", leaf.stderr)
	for _, port := range []string{"3080", "3023", "3024", "3025", "3022"} {
		requireUnreachable(t, net.JoinHostPort(ns.nsIP, port))
	}
	require.False(t, strings.Contains(leaf.stderr.String(), "panic"))
}
