package integration

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/web"
)

// TestRelayedJoinsCountPerClient is the attack on the join relay: an
// attacker that reaches only the proxy's HTTPS port sends enough failed
// joins through its relay to lock out an address. Auth must count them
// against the attacker's own address (the proxy passes it, over its
// proxy identity), not the proxy's: a node behind NAT joining through
// the same proxy from its own address right after must succeed.
func TestRelayedJoinsCountPerClient(t *testing.T) {
	ns := newNetNS(t)
	c := newNATCluster(t, ns)
	clt := adminClient(t, c.dataDir, c.p)
	_, pin := nodeToken(t, c.dataDir)
	webAddr := c.p.Addr(service.ListenerWeb).String()

	// From the host: the attacker's address is the veth's host side.
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return web.DialJoinRelay(ctx, webAddr)
	}
	var lastErr error
	for range auth.DefaultMaxAddrFailures + 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, lastErr = auth.Join(ctx, auth.JoinParams{
			AuthAddr: webAddr, Token: "not-a-token", CAPin: pin, Role: auth.RoleNode, Hostname: "attacker", Dial: dial,
		})
		cancel()
		require.Error(t, lastErr)
	}
	require.Contains(t, lastErr.Error(), "too many", "the attacker's own address is locked out: %v", lastErr)

	// The node in the namespace joins through the same relay from its own
	// address.
	_, rec := startNSNode(t, ns, c, clt, "after-attack")
	require.True(t, rec.Tunnel)
}
