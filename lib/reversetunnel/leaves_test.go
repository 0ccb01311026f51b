package reversetunnel

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// fakeTrust is a root's view of its leaves: a map of cluster name to
// host CA (roots this cluster trusts have one too), the leaves among
// them, the IsLeaf calls (what an unauthenticated peer could make auth
// do) and the reports received. mu guards all.
type fakeTrust struct {
	mu      sync.Mutex
	cas     map[string]*srvtest.CA
	leaves  map[string]bool
	asked   int
	touches map[string]int
}

func newFakeTrust(leaves map[string]*srvtest.CA) *fakeTrust {
	f := &fakeTrust{cas: map[string]*srvtest.CA{}, leaves: map[string]bool{}, touches: map[string]int{}}
	for name, ca := range leaves {
		f.cas[name], f.leaves[name] = ca, true
	}
	return f
}

func (f *fakeTrust) HostCAs(_ context.Context, name string) ([]ssh.PublicKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ca, ok := f.cas[name]
	if !ok {
		return nil, trace.NotFound("host CA of %q not found", name)
	}
	return []ssh.PublicKey{ca.Signer.PublicKey()}, nil
}

func (f *fakeTrust) IsLeaf(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	if !f.leaves[name] {
		return trace.NotFound("remote cluster %q not found", name)
	}
	return nil
}

func (f *fakeTrust) askedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked
}

func (f *fakeTrust) Touch(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.touches[name]++
	return nil
}

func (f *fakeTrust) touched(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.touches[name]
}

func (f *fakeTrust) remove(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.cas, name)
	delete(f.leaves, name)
}

func waitLeaf(t *testing.T, l *Leaves, name string, want bool) {
	t.Helper()
	require.Eventually(t, func() bool { return l.HasLeaf(name) == want }, 10*time.Second, 5*time.Millisecond, "leaf %s connected=%v", name, want)
}

// TestLeafTunnels: the root's tunnel port admits a leaf proxy whose
// certificate (role leaf, cluster extension) is signed by the host CA
// stored for that leaf, reports it, re-checks it every ReportInterval,
// and closes it once the leaf is no longer trusted.
func TestLeafTunnels(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	leafCA := srvtest.NewCA(t)
	trust := newFakeTrust(map[string]*srvtest.CA{"leaf": leafCA})
	// Keep-alives off: the fake clock then has one waiter per leaf
	// tunnel, its report loop.
	leaves, err := NewLeaves(LeavesConfig{Trust: trust, ClusterName: "root", KeepAliveInterval: -1, Deps: observe.Deps{Clock: clock}})
	require.NoError(t, err)
	f := newFixture(t, clock, func(c *ServerConfig) { c.Leaves = leaves })

	leafSigner := leafCA.RoleHostSigner(t, srvtest.HostCert{UUID: "leaf-proxy-1", Role: RoleLeaf, Cluster: "leaf"})
	f.startAgent(t, leafSigner, func(nc net.Conn) { _ = nc.Close() }, nil)
	waitLeaf(t, leaves, "leaf", true)
	require.False(t, f.srv.HasTunnel("leaf-proxy-1"), "a leaf is not a node tunnel")
	require.Eventually(t, func() bool { return trust.touched("leaf") == 1 }, 10*time.Second, 5*time.Millisecond, "reported at connect")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(DefaultLeafReportInterval)
	require.Eventually(t, func() bool { return trust.touched("leaf") == 2 }, 10*time.Second, 5*time.Millisecond)

	// Between reports the certificate is checked against the CA in
	// memory every second, without asking auth.
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	asked := trust.askedCount()
	clock.Advance(leafCACheckInterval)
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.Equal(t, asked, trust.askedCount())
	require.Equal(t, 2, trust.touched("leaf"))
	require.True(t, leaves.HasLeaf("leaf"))

	// pctl clusters rm on the root (the leaf's CAs go with its record):
	// the next CA check, within a second, closes the tunnel (the agent
	// reconnects and is refused from then on).
	n := len(f.audit.Events())
	trust.remove("leaf")
	clock.Advance(leafCACheckInterval)
	waitLeaf(t, leaves, "leaf", false)
	require.Eventually(t, func() bool {
		for _, e := range f.audit.Events()[n:] {
			if e.Type == events.AccessDenied && strings.Contains(e.Fields[events.FieldReason].(string), `cluster "leaf" is not a leaf of this cluster`) {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "the agent's reconnect is refused")
}

// TestLeafTunnelRefusals: every other claim to be a leaf is refused at
// the handshake, registers nothing and is audited.
func TestLeafTunnelRefusals(t *testing.T) {
	leafCA := srvtest.NewCA(t)
	trust := newFakeTrust(map[string]*srvtest.CA{"leaf": leafCA})
	// This cluster is also the leaf of "upper": it holds upper's host CA,
	// but upper is no leaf here.
	upperCA := srvtest.NewCA(t)
	trust.cas["upper"] = upperCA
	leaves, err := NewLeaves(LeavesConfig{Trust: trust, ClusterName: "root"})
	require.NoError(t, err)
	f := newFixture(t, nil, func(c *ServerConfig) { c.Leaves = leaves })
	other := srvtest.NewCA(t)
	for _, tc := range []struct {
		name   string
		signer ssh.Signer
		reason string
	}{
		// The leaf presents a CA other than the one exchanged.
		{"another CA", other.RoleHostSigner(t, srvtest.HostCert{UUID: "p", Role: RoleLeaf, Cluster: "leaf"}), "not signed by a trusted host CA"},
		// A leaf's node is not its proxy.
		{"a leaf node's certificate", leafCA.RoleHostSigner(t, srvtest.HostCert{UUID: "p", Role: RoleNode, Cluster: "leaf"}), "not signed by a trusted host CA"},
		{"a cluster that is not a leaf", other.RoleHostSigner(t, srvtest.HostCert{UUID: "p", Role: RoleLeaf, Cluster: "stranger"}), `cluster "stranger" is not a leaf of this cluster`},
		// The root's own CA signing role leaf for the root's name.
		{"the root's own name", f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "p", Role: RoleLeaf, Cluster: "root"}), `names this cluster "root"`},
		{"no cluster", leafCA.RoleHostSigner(t, srvtest.HostCert{UUID: "p", Role: RoleLeaf}), "names no valid cluster"},
		{"expired", leafCA.RoleHostSigner(t, srvtest.HostCert{UUID: "p", Role: RoleLeaf, Cluster: "leaf", ValidBefore: time.Now().Add(-time.Hour)}), "expired"},
		// The root this cluster trusts is not its leaf, though its CA
		// is stored here.
		{"this cluster's own root", upperCA.RoleHostSigner(t, srvtest.HostCert{UUID: "p", Role: RoleLeaf, Cluster: "upper"}), `cluster "upper" is not a leaf of this cluster`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(f.audit.Events())
			require.Error(t, dialRaw(t, f.addr, tc.signer))
			require.False(t, leaves.HasLeaf("leaf"))
			evs := f.audit.Events()[n:]
			require.Len(t, evs, 1)
			require.Equal(t, events.AccessDenied, evs[0].Type)
			require.Contains(t, evs[0].Fields[events.FieldReason], tc.reason)
		})
	}
	require.Zero(t, trust.touched("leaf"))
	// Only the certificate its stored CA signed ("upper") got as far as
	// asking whether the cluster is a leaf: the others cost a map lookup.
	require.Equal(t, 1, trust.askedCount())
}
