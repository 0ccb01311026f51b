package proxy

import (
	"context"
	"errors"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// TestHideDenied: a node the caller's AccessFilter hides and a node their
// Authorize refuses are answered in the very words of a node that does
// not exist, and only those two are reported as denials.
func TestHideDenied(t *testing.T) {
	nodes := []services.Node{
		node("p1", "prod-db", "10.2.0.1:3022", 0, "env", "prod"),
		node("d1", "dev-db", "10.2.0.2:3022", 0, "env", "dev"),
		node("a1", "amb", "10.2.0.3:3022", 0, "env", "dev"),
		node("a2", "amb", "10.2.0.4:3022", 0, "env", "dev"),
	}
	env := newRouterEnv(t, nodes, nil)
	ctx := context.Background()
	devOnly := func(n services.Node) bool { return n.Labels["env"] == "dev" }
	refuse := func(services.Node) error { return trace.AccessDenied("login %q not allowed", "root") }

	dial := func(host string, filter AccessFilter, authorize func(services.Node) error) (Target, Route, error) {
		tgt := Target{Host: host, Port: "3022"}
		conn, route, err := env.router.DialHost(ctx, RouteRequest{Target: tgt, Access: filter, Authorize: authorize})
		require.Nil(t, conn)
		require.Error(t, err)
		return tgt, route, err
	}
	missingTarget, missingRoute, missingErr := dial("nosuch", devOnly, nil)
	missing, denied := HideDenied(missingTarget, missingRoute, missingErr)
	require.False(t, denied, "a node that does not exist is no denial")
	require.True(t, trace.IsNotFound(missing))
	words := func(host string) string {
		return `node "` + host + `" not found in cluster "` + testCluster + `"`
	}
	require.Equal(t, words("nosuch"), trace.UserMessage(missing))

	t.Run("hidden by the access filter", func(t *testing.T) {
		tgt, route, err := dial("prod-db", devOnly, nil)
		require.Equal(t, []string{"p1"}, route.Hidden)
		visible, denied := HideDenied(tgt, route, err)
		require.True(t, denied)
		require.True(t, trace.IsNotFound(visible))
		require.Equal(t, words("prod-db"), trace.UserMessage(visible))
	})
	t.Run("refused by Authorize on the chosen node", func(t *testing.T) {
		tgt, route, err := dial("dev-db", devOnly, refuse)
		require.True(t, trace.IsAccessDenied(err))
		visible, denied := HideDenied(tgt, route, err)
		require.True(t, denied)
		require.True(t, trace.IsNotFound(visible))
		require.False(t, trace.IsAccessDenied(visible))
		require.Equal(t, words("dev-db"), trace.UserMessage(visible))
		require.NotContains(t, visible.Error(), "root", "the cause stays in the log")
	})
	t.Run("other errors pass unchanged", func(t *testing.T) {
		tgt, route, err := dial("amb", devOnly, nil)
		require.True(t, IsAmbiguousHost(err))
		visible, denied := HideDenied(tgt, route, err)
		require.False(t, denied)
		require.Same(t, err, visible)
		other := errors.New("boom")
		visible, denied = HideDenied(tgt, Route{}, other)
		require.False(t, denied)
		require.Same(t, other, visible)
		visible, denied = HideDenied(tgt, Route{}, nil)
		require.NoError(t, visible)
		require.False(t, denied)
	})
}
