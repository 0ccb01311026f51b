package auth

import (
	"context"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/services"
)

// The in-process client reaches the same handlers through the same role
// table as a client over TCP: what a role may not do over the network it
// may not do in memory either, with the same answer.
func TestInProcessClientAppliesTheRoleTable(t *testing.T) {
	ctx := context.Background()
	env := newTestAPI(t)
	nodeID := env.identity(t, "00000000-0000-4000-8000-000000000001", RoleNode)
	proxyID := env.identity(t, "00000000-0000-4000-8000-000000000002", RoleProxy)

	inNode, err := env.api.NewInProcessClient(nodeID, env.clock, testLogger())
	require.NoError(t, err)
	defer inNode.Close()
	inProxy, err := env.api.NewInProcessClient(proxyID, env.clock, testLogger())
	require.NoError(t, err)
	defer inProxy.Close()
	tcpNode := env.client(t, nodeID)

	// Allowed: a proxy reads the inventory and the second-factor hint.
	_, err = inProxy.GetNodes(ctx, testCluster)
	require.NoError(t, err)
	sf, err := inProxy.ClusterSecondFactor(ctx)
	require.NoError(t, err)
	require.Equal(t, webapi.SecondFactorOff, sf)

	// Denied, in memory exactly as over TCP: users are administration,
	// the hint is the proxy's.
	_, errMem := inNode.GetUsers(ctx)
	_, errTCP := tcpNode.GetUsers(ctx)
	require.True(t, trace.IsAccessDenied(errMem), "%v", errMem)
	require.True(t, trace.IsAccessDenied(errTCP), "%v", errTCP)
	require.Equal(t, trace.UserMessage(errTCP), trace.UserMessage(errMem))
	_, err = inNode.ClusterSecondFactor(ctx)
	require.True(t, trace.IsAccessDenied(err), "%v", err)
}

// Once the API server is closing, an in-process call fails as a
// connection problem (the failover and retry code's signal), and a dial
// waiting to be accepted does not hang.
func TestInProcessClientAfterClose(t *testing.T) {
	ctx := context.Background()
	env := newTestAPI(t)
	clt, err := env.api.NewInProcessClient(env.identity(t, "00000000-0000-4000-8000-000000000002", RoleProxy), env.clock, testLogger())
	require.NoError(t, err)
	defer clt.Close()
	require.NoError(t, env.api.Close())
	_, err = clt.GetNodes(ctx, testCluster)
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	_, err = env.api.DialInProcess(ctx)
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
}

// The auth server's own host may carry a name the naming rules keep from
// joined nodes (an all-in-one named after the machine, in a cluster named
// after the machine); any other node announcing that name is refused.
func TestOwnHostIsExemptFromNamingRulesOnly(t *testing.T) {
	ctx := context.Background()
	env := newTestAPI(t)
	const own = "00000000-0000-4000-8000-0000000000aa"
	const other = "00000000-0000-4000-8000-0000000000bb"
	env.auth.cfg.HostUUID = own

	announce := func(id string) error {
		clt, err := env.api.NewInProcessClient(env.identity(t, id, RoleNode), env.clock, testLogger())
		require.NoError(t, err)
		defer clt.Close()
		return clt.UpsertNode(ctx, services.Node{UUID: id, Hostname: testCluster, Tunnel: true})
	}
	require.NoError(t, announce(own))
	err := announce(other)
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, trace.UserMessage(err), "is the name of cluster")

	// Everything else still holds for the own host: it announces only
	// itself.
	clt, err := env.api.NewInProcessClient(env.identity(t, own, RoleNode), env.clock, testLogger())
	require.NoError(t, err)
	defer clt.Close()
	err = clt.UpsertNode(ctx, services.Node{UUID: other, Hostname: "x", Tunnel: true})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
}

// BenchmarkAPICall is one API call (a role read, what a node does at
// start) through the in-process client and through a client over loopback
// TCP, side by side in one run.
func BenchmarkAPICall(b *testing.B) {
	ctx := context.Background()
	env := newTestAPI(b)
	id := env.identity(b, "00000000-0000-4000-8000-000000000001", RoleNode)
	inProc, err := env.api.NewInProcessClient(id, env.clock, testLogger())
	require.NoError(b, err)
	defer inProc.Close()
	for _, c := range []struct {
		name string
		clt  *Client
	}{{"in-process", inProc}, {"tcp", env.client(b, id)}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.clt.GetRole(ctx, "access"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
