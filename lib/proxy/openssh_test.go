package proxy

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/services"
)

// healthMap is a NodeHealth answering from a map: the Router's side of
// the contract (health.Checker is tested against real servers in its own
// package, and with this Router in TestRouterWithRealSSHD there).
type healthMap struct {
	mu      sync.Mutex
	offline map[string]bool
}

func (h *healthMap) Online(uuid string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.offline[uuid]
}

func (h *healthMap) set(uuid string, online bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.offline[uuid] = !online
}

func openSSHNode(uuid, hostname, addr string, labels ...string) services.Node {
	n := node(uuid, hostname, addr, 0, labels...)
	n.Kind, n.Expires, n.LastHeartbeat = services.NodeKindOpenSSH, time.Time{}, time.Time{}
	return n
}

// bannerServer answers every connection with an SSH identification
// string, as an sshd does first.
func bannerServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u7\r\n"))
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestOpenSSHNodes: an OpenSSH node is one more local case of routing:
// the same rules, RBAC before anything, no heartbeat expiry, and its
// health decides whether it is offline.
func TestOpenSSHNodes(t *testing.T) {
	ctx := context.Background()
	addr := bannerServer(t)
	health := &healthMap{offline: map[string]bool{}}
	dialer := &recordingDialer{}
	down := freeport.RefusedAddr(t)
	nodes := []services.Node{
		openSSHNode("o1", "db1", addr, "env", "prod"),
		openSSHNode("o2", "db2", down, "env", "prod"),
		openSSHNode("o3", "secret", "127.0.0.1:8", "env", "secret"),
		// A Postern node and an OpenSSH node under one name.
		openSSHNode("o4", "shared", "127.0.0.1:9", "env", "prod"),
		node("p4", "shared", "127.0.0.1:10", time.Minute, "env", "prod"),
	}
	env := newRouterEnvWith(t, nodes, func(c *RouterConfig) { c.Dialer, c.Health = dialer, health })
	env.setNetworking(t, services.RoutingUnambiguousMatch, false, 2*time.Second)
	prodOnly := func(n services.Node) bool { return n.Labels["env"] == "prod" }

	// Online: dialed at its address, the banner checked as for any node.
	conn, route, err := env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "db1", Port: "22"}, Access: prodOnly})
	require.NoError(t, err)
	require.Equal(t, "o1", route.Node.UUID)
	require.Equal(t, "matched hostname", route.Reason)
	b, err := io.ReadAll(conn)
	require.NoError(t, err)
	require.Contains(t, string(b), "SSH-2.0-OpenSSH")
	conn.Close()
	// By address and by NAME.CLUSTER too.
	route, err = env.router.Route(ctx, Target{Host: "db1." + testCluster}, prodOnly)
	require.NoError(t, err)
	require.Equal(t, "o1", route.Node.UUID)

	// Offline: the documented error, nothing dialed.
	health.set("o2", false)
	_, route, err = env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "db2"}, Access: prodOnly})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.EqualError(t, err, `node "db2" is offline: its SSH server does not answer`)
	require.Equal(t, "o2", route.Node.UUID)
	require.Equal(t, []string{addr}, dialer.addrs())
	require.Contains(t, env.router.ExplainTarget(ctx, Target{Host: "db2"}).String(),
		"via:        registered address "+down+" (an OpenSSH server; offline: its SSH server does not answer)")

	// RBAC before health: a node the user may not reach is not found,
	// offline or not, and never said to be offline.
	health.set("o3", false)
	_, route, err = env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "secret"}, Access: prodOnly})
	visible, denied := HideDenied(Target{Host: "secret"}, route, err)
	require.True(t, denied)
	require.EqualError(t, visible, `node "secret" not found in cluster "c1"`)
	require.Equal(t, []string{"o3"}, route.Hidden)

	// The same rules for duplicates: ambiguous under unambiguous_match,
	// the Postern node's heartbeat wins most_recent (an OpenSSH record
	// has none).
	_, err = env.router.Route(ctx, Target{Host: "shared"}, prodOnly)
	require.True(t, IsAmbiguousHost(err), "%v", err)
	require.Contains(t, err.Error(), "o4 addr=127.0.0.1:9 labels=env=prod last_heartbeat=unknown")
	env.setNetworking(t, services.RoutingMostRecent, false, 2*time.Second)
	route, err = env.router.Route(ctx, Target{Host: "shared"}, prodOnly)
	require.NoError(t, err)
	require.Equal(t, "p4", route.Node.UUID)

	// No heartbeat, no expiry: long after the Postern node's record died,
	// the OpenSSH nodes still route.
	env.clock.Advance(time.Hour)
	route, err = env.router.Route(ctx, Target{Host: "shared"}, prodOnly)
	require.NoError(t, err)
	require.Equal(t, "o4", route.Node.UUID)
	route, err = env.router.Route(ctx, Target{Host: "db1"}, prodOnly)
	require.NoError(t, err)
	require.Equal(t, "o1", route.Node.UUID)

	// Back online: dialed again.
	health.set("o2", true)
	_, _, err = env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "db2"}, Access: prodOnly})
	require.ErrorContains(t, err, `failed to dial node "db2" (`+down+`)`)
}

// TestOpenSSHNodesWithoutChecker: a Router without a health checker
// (pctl route) dials OpenSSH nodes, and a dead one fails at the dial.
func TestOpenSSHNodesWithoutChecker(t *testing.T) {
	env := newRouterEnv(t, []services.Node{openSSHNode("o1", "db1", "127.0.0.1:7")}, nil)
	e := env.router.ExplainTarget(context.Background(), Target{Host: "db1"})
	require.Equal(t, "registered address 127.0.0.1:7 (an OpenSSH server)", e.Via)
}

// TestNodeStatuses: a listing shows an OpenSSH node online or offline as
// this proxy's checker finds it (the answer its dials go by), and says
// nothing of a Postern node's.
func TestNodeStatuses(t *testing.T) {
	health := &healthMap{offline: map[string]bool{"o2": true}}
	env := newRouterEnvWith(t, nil, func(c *RouterConfig) { c.Health = health })
	entries := []proxyapi.NodeEntry{{UUID: "o1", Kind: services.NodeKindOpenSSH}, {UUID: "o2", Kind: services.NodeKindOpenSSH}, {UUID: "p1"}}
	env.router.NodeStatuses(entries)
	require.Equal(t, []string{proxyapi.NodeOnline, proxyapi.NodeOffline, ""}, []string{entries[0].Status, entries[1].Status, entries[2].Status})
	health.set("o2", true)
	env.router.NodeStatuses(entries)
	require.Equal(t, proxyapi.NodeOnline, entries[1].Status)

	// Without a checker every OpenSSH node is dialed: online.
	env = newRouterEnv(t, nil, nil)
	entries = []proxyapi.NodeEntry{{UUID: "o2", Kind: services.NodeKindOpenSSH}}
	env.router.NodeStatuses(entries)
	require.Equal(t, proxyapi.NodeOnline, entries[0].Status)
}
