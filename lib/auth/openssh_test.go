package auth

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// TestHostsCannotClaimOpenSSH is the attack: a host holding a real node
// or proxy identity announces its own record as kind openssh (which
// would never expire, and which the proxies would reach with their own
// SSH client). Refused, and nothing is written; an admin may write one.
func TestHostsCannotClaimOpenSSH(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	for _, role := range []string{RoleNode, RoleProxy} {
		t.Run(role, func(t *testing.T) {
			uuid := "host-" + role
			hn := env.newHostNode(t, uuid, role)
			host := env.client(t, hn.id)
			err := host.UpsertNode(ctx, services.Node{UUID: uuid, Hostname: "db1", Addr: hn.addr, Kind: services.NodeKindOpenSSH})
			requireKind(t, err, trace.IsAccessDenied, `may not announce a node of kind "openssh": only an admin registers one`)
			_, err = env.store.GetNode(ctx, testCluster, uuid)
			require.True(t, trace.IsNotFound(err), "nothing written: %v", err)

			// Its own honest heartbeat still works, and cannot be turned
			// into an OpenSSH record afterwards either.
			require.NoError(t, host.UpsertNode(ctx, services.Node{UUID: uuid, Hostname: "db1", Addr: hn.addr, Expires: env.clock.Now().Add(time.Minute)}))
			err = host.UpsertNode(ctx, services.Node{UUID: uuid, Hostname: "db1", Addr: hn.addr, Kind: services.NodeKindOpenSSH})
			require.True(t, trace.IsAccessDenied(err), "%v", err)
			got, err := env.store.GetNode(ctx, testCluster, uuid)
			require.NoError(t, err)
			require.Empty(t, got.Kind)
			require.False(t, got.Expires.IsZero())
		})
	}

	admin := env.adminClient(t)
	require.NoError(t, admin.UpsertNode(ctx, services.Node{UUID: "openssh-1", Hostname: "db2", Addr: "127.0.0.1:22", Kind: services.NodeKindOpenSSH}))
	got, err := env.store.GetNode(ctx, testCluster, "openssh-1")
	require.NoError(t, err)
	require.Equal(t, services.NodeKindOpenSSH, got.Kind)
	require.True(t, got.Expires.IsZero(), "no heartbeat, no expiry")
}
