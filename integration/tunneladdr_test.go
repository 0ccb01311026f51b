package integration

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// TestTunnelAddrWithAnExplicitIP: a proxy listening for tunnels on one
// specific IP (tunnel_addr: 127.0.0.7:PORT, its SSH port elsewhere) tells
// nodes to dial that IP, so its certificate must name it: a node behind
// NAT joins, is listed as a tunnel node, and takes sessions. Before, the
// node refused the proxy ("principal 127.0.0.7 not in the set of valid
// principals") until 127.0.0.7 was added to public_addrs by hand.
func TestTunnelAddrWithAnExplicitIP(t *testing.T) {
	c := newAllInOneWith(t, func(cfg *config.Config) { cfg.TunnelAddr = "127.0.0.7:0" })
	host, _, err := net.SplitHostPort(c.p.Addr(service.ListenerTunnel).String())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.7", host)
	n, _ := startNATNode(t, c, "natted")
	clt := adminClient(t, c.dataDir, c.p)
	waitNodes(t, clt, 2)
	rec := nodeByUUID(t, clt, n.HostUUID())
	require.True(t, rec.Tunnel)

	sc, err := c.viaJump(t, "natted:0")
	require.NoError(t, err)
	out, err := run(t, sc, "echo through-127.0.0.7")
	require.NoError(t, err)
	require.Equal(t, "through-127.0.0.7\n", out)
}
