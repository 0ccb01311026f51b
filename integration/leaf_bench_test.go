package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/service"
)

// BenchmarkJumpLeafVsLocal measures `ssh -J root HOST.LEAF` setup (a
// fresh root proxy connection, direct-tcpip, the node's handshake, one
// exec started) to a leaf cluster's node against the same to the root's
// own node, side by side in one run (the arms alternate every
// iteration). Both nodes are all-in-one nodes of their cluster, in this
// process; the leaf's hop adds the LeafRequest over the leaf's tunnel,
// the leaf's certificate check and Router, and the leaf proxy's dial.
// Target (issue 14): setup ratio <= 1.3. The default run is short
// (-benchtime=1x is one iteration of each arm).
func BenchmarkJumpLeafVsLocal(b *testing.B) {
	root := newNamedCluster(b, "root")
	leaf := newNamedCluster(b, "leaf")
	establishTrust(b, root, leaf, "[{remote: access, local: [access]}]")
	require.Eventually(b, func() bool { return clusterStatus(b, root, "leaf") == "online" }, 30*time.Second, 100*time.Millisecond)

	cas, err := adminClient(b, root.dataDir, root.p).GetCertAuthorities(b.Context(), "host", false)
	require.NoError(b, err)
	var keys []ssh.PublicKey
	for _, ca := range cas {
		for _, k := range ca.SSHPublicKeys {
			pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(strings.TrimSpace(k)))
			require.NoError(b, err)
			keys = append(keys, pub)
		}
	}
	cfg := root.clientConfig(b)
	cfg.HostKeyCallback = authz.HostKeyCallback(keys, nil)
	proxyAddr := root.p.Addr(service.ListenerProxySSH).String()
	const local, remote = "node-1:0", "node-1.leaf:0"
	// Warm both paths (first handshakes, the nodes' caches).
	jumpOnce(b, cfg, proxyAddr, local)
	jumpOnce(b, cfg, proxyAddr, remote)

	var setupL, setupR time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			setupL += jumpOnce(b, cfg, proxyAddr, local)
			setupR += jumpOnce(b, cfg, proxyAddr, remote)
		} else {
			setupR += jumpOnce(b, cfg, proxyAddr, remote)
			setupL += jumpOnce(b, cfg, proxyAddr, local)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(setupL.Seconds()*1000/n, "local-setup-ms")
	b.ReportMetric(setupR.Seconds()*1000/n, "leaf-setup-ms")
	b.ReportMetric(setupR.Seconds()/setupL.Seconds(), "setup-ratio")
}
