package auth

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

func holderIDs(tcs []services.TunnelConnection) []string {
	out := []string{}
	for _, tc := range tcs {
		out = append(out, tc.ProxyUUID)
	}
	return out
}

// waitHolders waits (on the locator's own channel, no polling) until the
// holders of node seen from exclude are want.
func waitHolders(t *testing.T, l *services.TunnelLocator, node, exclude string, want []string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := l.Located(node)
		if got := holderIDs(l.Holders(node, exclude)); len(got) == len(want) && (len(want) == 0 || got[0] == want[0]) {
			require.Equal(t, want, got)
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("holders of %s: got %v, want %v", node, holderIDs(l.Holders(node, exclude)), want)
		}
	}
}

// TestTunnelConnectionLeases: a proxy's lease reaches another proxy's
// locator over the watch stream, carries the peer address, lapses at its
// TTL on the (fake) clock unless renewed, and is removed on close.
func TestTunnelConnectionLeases(t *testing.T) {
	env, _ := newAuditedAPI(t)
	ctx := context.Background()
	a := env.client(t, env.identity(t, "proxy-a", RoleProxy))
	b := env.client(t, env.identity(t, "proxy-b", RoleProxy))

	loc, err := services.NewTunnelLocator(services.TunnelLocatorConfig{Events: b.TunnelConnectionEvents(), Clock: env.clock})
	require.NoError(t, err)
	t.Cleanup(func() { loc.Close() })
	require.NoError(t, loc.WaitSynced(ctx))

	require.NoError(t, a.UpsertTunnelConnections(ctx, authapi.TunnelConnectionsRequest{PeerAddr: "127.0.0.1:3021", NodeUUIDs: []string{"n1"}}))
	waitHolders(t, loc, "n1", "proxy-b", []string{"proxy-a"})
	got := loc.Holders("n1", "proxy-b")[0]
	require.Equal(t, "127.0.0.1:3021", got.PeerAddr)
	require.True(t, env.clock.Now().Add(services.DefaultTunnelConnectionTTL).Equal(got.Expires), "%v", got.Expires)
	// A proxy never lists itself.
	require.Empty(t, loc.Holders("n1", "proxy-a"))

	// Renewed at half the TTL, it outlives the first lease.
	env.clock.Advance(services.DefaultTunnelConnectionTTL / 2)
	require.NoError(t, a.UpsertTunnelConnections(ctx, authapi.TunnelConnectionsRequest{PeerAddr: "127.0.0.1:3021", NodeUUIDs: []string{"n1"}}))
	waitExpires(t, loc, "n1", env.clock.Now().Add(services.DefaultTunnelConnectionTTL))
	env.clock.Advance(services.DefaultTunnelConnectionTTL/2 + time.Second)
	require.Equal(t, []string{"proxy-a"}, holderIDs(loc.Holders("n1", "proxy-b")))

	// Not renewed: gone at the TTL, for the locator and in the backend.
	env.clock.Advance(services.DefaultTunnelConnectionTTL)
	require.Empty(t, loc.Holders("n1", "proxy-b"))
	tcs, err := env.store.GetTunnelConnections(ctx)
	require.NoError(t, err)
	require.Empty(t, tcs)

	// Deleted on close.
	require.NoError(t, a.UpsertTunnelConnections(ctx, authapi.TunnelConnectionsRequest{NodeUUIDs: []string{"n2"}}))
	waitHolders(t, loc, "n2", "proxy-b", []string{"proxy-a"})
	require.NoError(t, a.DeleteTunnelConnections(ctx, authapi.TunnelConnectionsRequest{NodeUUIDs: []string{"n2"}}))
	tcs, err = env.store.GetTunnelConnections(ctx)
	require.NoError(t, err)
	require.Empty(t, tcs)
	// Deleting a lapsed lease is no error.
	require.NoError(t, a.DeleteTunnelConnections(ctx, authapi.TunnelConnectionsRequest{NodeUUIDs: []string{"n2"}}))
}

func waitExpires(t *testing.T, l *services.TunnelLocator, node string, want time.Time) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := l.Located(node)
		if h := l.Holders(node, ""); len(h) == 1 && h[0].Expires.Equal(want) {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("lease of %s not renewed to %v: %v", node, want, l.Holders(node, ""))
		}
	}
}

// TestTunnelConnectionForAnotherProxy is the attack: proxy A claims that
// proxy B holds a tunnel (so that B's users are sent to it, or B's real
// claim is overwritten), deletes B's lease, and a node writes a lease.
// Each is refused or touches only A's own entries; the claim is audited.
func TestTunnelConnectionForAnotherProxy(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	a := env.client(t, env.identity(t, "proxy-a", RoleProxy))
	b := env.client(t, env.identity(t, "proxy-b", RoleProxy))
	node := env.client(t, env.identity(t, "node-1", RoleNode))

	require.NoError(t, b.UpsertTunnelConnections(ctx, authapi.TunnelConnectionsRequest{PeerAddr: "10.0.0.2:3021", NodeUUIDs: []string{"n1"}}))

	err := a.UpsertTunnelConnections(ctx, authapi.TunnelConnectionsRequest{ProxyUUID: "proxy-b", PeerAddr: "10.6.6.6:3021", NodeUUIDs: []string{"n1"}})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.Contains(t, err.Error(), `proxy "proxy-a" may not write tunnel connections for proxy "proxy-b"`)
	e := waitEvent(t, rec, events.APIDenied, func(e events.Event) bool {
		return e.Fields[events.FieldEndpoint] == "POST /v1/tunnel_connections"
	})
	require.Equal(t, "proxy-a", e.Fields[events.FieldServerID])

	err = a.DeleteTunnelConnections(ctx, authapi.TunnelConnectionsRequest{ProxyUUID: "proxy-b", NodeUUIDs: []string{"n1"}})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	// Without naming B, A's delete is A's: B's lease stays.
	require.NoError(t, a.DeleteTunnelConnections(ctx, authapi.TunnelConnectionsRequest{NodeUUIDs: []string{"n1"}}))

	err = node.UpsertTunnelConnections(ctx, authapi.TunnelConnectionsRequest{NodeUUIDs: []string{"node-1"}})
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	tcs, err := env.store.GetTunnelConnections(ctx)
	require.NoError(t, err)
	require.Len(t, tcs, 1)
	require.Equal(t, "proxy-b", tcs[0].ProxyUUID)
	require.Equal(t, "10.0.0.2:3021", tcs[0].PeerAddr)

	// Bad input is named.
	err = a.UpsertTunnelConnections(ctx, authapi.TunnelConnectionsRequest{NodeUUIDs: []string{"a/b"}})
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), "node_uuid")
	err = a.UpsertTunnelConnections(ctx, authapi.TunnelConnectionsRequest{PeerAddr: "nope", NodeUUIDs: []string{"n1"}})
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), "peer_addr")
}
