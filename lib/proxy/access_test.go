package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// TestRouteAccessFilter: routing rule 5 (docs/reference.md, Routing) runs over the nodes the
// caller may reach only. The invisible nodes here carry env=prod, and the
// caller's filter lets only env=dev through.
func TestRouteAccessFilter(t *testing.T) {
	nodes := []services.Node{
		// A newer invisible "app" must not win most_recent.
		node("a1", "app", "10.1.0.1:3022", 2*time.Minute, "env", "dev"),
		node("a2", "app", "10.1.0.2:3022", 0, "env", "prod"),
		// One visible and two invisible duplicates: unambiguous.
		node("d1", "dup", "10.1.0.3:3022", time.Minute, "env", "dev"),
		node("d2", "dup", "10.1.0.4:3022", 0, "env", "prod"),
		node("d3", "dup", "10.1.0.5:3022", 0, "env", "prod", "secret", "s3cr3t"),
		// Two visible and one invisible: ambiguous between the two only.
		node("m1", "multi", "10.1.0.6:3022", 0, "env", "dev"),
		node("m2", "multi", "10.1.0.7:3022", 0, "env", "dev"),
		node("m3", "multi", "10.1.0.8:3022", 0, "env", "prod", "secret", "s3cr3t"),
		// Only invisible nodes.
		node("s1", "secret", "10.1.0.9:3022", 0, "env", "prod"),
		// Case-insensitive fallback, filtered too.
		node("c1u", "Upper", "10.1.0.10:3022", 0, "env", "dev"),
		node("c2u", "UPPER", "10.1.0.11:3022", 0, "env", "prod"),
	}
	env := newRouterEnv(t, nodes, nil)
	ctx := context.Background()
	devOnly := func(n services.Node) bool { return n.Labels["env"] == "dev" }
	invisible := []string{"a2", "d2", "d3", "m3", "s1", "c2u", "prod", "s3cr3t", "10.1.0.2", "10.1.0.4", "10.1.0.5", "10.1.0.8", "10.1.0.9", "10.1.0.11"}

	for _, c := range []struct {
		target string
		strat  string
		admin  bool
		want   string
		hidden []string
		err    string
		isErr  func(error) bool
	}{
		{target: "app", strat: services.RoutingMostRecent, want: "a1", hidden: []string{"a2"}},
		{target: "app", want: "a1", hidden: []string{"a2"}},
		{target: "app", admin: true, isErr: IsAmbiguousHost},
		{target: "app", strat: services.RoutingMostRecent, admin: true, want: "a2"},
		{target: "dup", want: "d1", hidden: []string{"d2", "d3"}},
		{target: "dup:3022", want: "d1", hidden: []string{"d2", "d3"}},
		{target: "multi", isErr: IsAmbiguousHost, hidden: []string{"m3"},
			err: "ambiguous host \"multi\" matches 2 nodes in cluster \"c1\"; connect by UUID instead:\n" +
				"  m1 addr=10.1.0.6:3022 labels=env=dev last_heartbeat=2026-11-30T12:00:00Z\n" +
				"  m2 addr=10.1.0.7:3022 labels=env=dev last_heartbeat=2026-11-30T12:00:00Z"},
		// Invisible only: exactly the words of a node that does not exist.
		{target: "secret", hidden: []string{"s1"}, err: `node "secret" not found in cluster "c1"`, isErr: trace.IsNotFound},
		{target: "a2", hidden: []string{"a2"}, err: `node "a2" not found in cluster "c1"`, isErr: trace.IsNotFound},
		{target: "10.1.0.9", hidden: []string{"s1"}, err: `node "10.1.0.9" not found in cluster "c1"`, isErr: trace.IsNotFound},
		{target: "secret.c1", hidden: []string{"s1"}, err: `node "secret.c1" not found in cluster "c1"`, isErr: trace.IsNotFound},
		{target: "upper", want: "c1u", hidden: []string{"c2u"}},
		{target: "UPPER", want: "c1u", hidden: []string{"c2u"}},
	} {
		name := c.target + "/" + c.strat
		if c.admin {
			name += "/admin"
		}
		t.Run(name, func(t *testing.T) {
			strat := c.strat
			if strat == "" {
				strat = services.RoutingUnambiguousMatch
			}
			env.setNetworking(t, strat, false, 0)
			tgt, err := ParseTarget(c.target)
			require.NoError(t, err)
			filter := AccessFilter(devOnly)
			if c.admin {
				filter = nil
			}
			route, err := env.router.Route(ctx, tgt, filter)
			require.Equal(t, c.hidden, route.Hidden)
			if c.err != "" || c.isErr != nil {
				require.Error(t, err)
				if c.err != "" {
					require.Equal(t, c.err, err.Error())
				}
				if c.isErr != nil {
					require.True(t, c.isErr(err), "%T %v", err, err)
				}
			} else {
				require.NoError(t, err)
				require.Equal(t, c.want, route.Node.UUID)
			}
			if c.admin {
				return
			}
			// Nothing the caller may not see is named, counted or
			// hinted at: not in the error, the candidates or the reason.
			for _, n := range route.Candidates {
				require.True(t, devOnly(n), "invisible candidate %s", n.UUID)
			}
			for _, s := range invisible {
				if s == tgt.Host {
					continue // the caller's own words, echoed
				}
				if err != nil {
					require.NotContains(t, err.Error(), s)
				}
				require.NotContains(t, route.Reason, s)
			}
		})
	}
}

// TestDialHostAccessFilter: DialHost applies the filter before routing and
// so dials the visible node, never the newer invisible one.
func TestDialHostAccessFilter(t *testing.T) {
	dialer := &recordingDialer{hang: map[string]bool{"10.1.0.1:3022": true, "10.1.0.2:3022": true}}
	env := newRouterEnv(t, []services.Node{
		node("a1", "app", "10.1.0.1:3022", 2*time.Minute, "env", "dev"),
		node("a2", "app", "10.1.0.2:3022", 0, "env", "prod"),
	}, dialer)
	env.setNetworking(t, services.RoutingMostRecent, false, 10*time.Millisecond)
	_, route, err := env.router.DialHost(context.Background(), RouteRequest{
		Target: Target{Host: "app"},
		Access: func(n services.Node) bool { return n.Labels["env"] == "dev" },
	})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.Equal(t, "a1", route.Node.UUID)
	require.Equal(t, []string{"10.1.0.1:3022"}, dialer.addrs())
}

// TestAmbiguousErrorEscapes: the candidate lines reach users' terminals
// (ssh -J stderr, psh, the browser): node-supplied text is escaped. The
// store refuses such labels today (services.CheckNodeLabels), so this is
// the second line of defence, for records written before that check:
// built here directly, as no store would hold them.
func TestAmbiguousErrorEscapes(t *testing.T) {
	err := &AmbiguousHostError{Host: "evil", Cluster: "c1", Candidates: []services.Node{
		node("e1", "evil", "10.2.0.1:3022", 0, "env", "\x1b[31m\r\n"),
		node("e2", "evil\x1b]0;owned\a", "10.2.0.2:3022", 0),
	}}
	require.True(t, IsAmbiguousHost(err))
	require.Contains(t, err.Error(), `e1 addr=10.2.0.1:3022 labels=env="\x1b[31m\r\n" last_heartbeat=`)
	require.NotContains(t, err.Error(), "\x1b")
	require.NotContains(t, err.Error(), "\r")
	require.NotContains(t, err.Error(), "\a")
}
