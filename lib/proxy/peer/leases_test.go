package peer

import (
	"context"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

type fakeTunnelSet struct {
	mu      sync.Mutex
	uuids   map[string]bool
	changed chan struct{}
}

func (f *fakeTunnelSet) TunnelUUIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []string{}
	for u := range f.uuids {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

func (f *fakeTunnelSet) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return f.changed
}

func (f *fakeTunnelSet) set(uuid string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.uuids[uuid] = true
	} else {
		delete(f.uuids, uuid)
	}
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

type leaseCall struct {
	op    string
	nodes []string
	addr  string
}

type recordingWriter struct{ calls chan leaseCall }

func (w *recordingWriter) UpsertTunnelConnections(_ context.Context, req authapi.TunnelConnectionsRequest) error {
	// A copy: the test sorts it while the keeper still reads its own.
	w.calls <- leaseCall{"upsert", slices.Clone(req.NodeUUIDs), req.PeerAddr}
	return nil
}

func (w *recordingWriter) DeleteTunnelConnections(_ context.Context, req authapi.TunnelConnectionsRequest) error {
	w.calls <- leaseCall{"delete", slices.Clone(req.NodeUUIDs), req.PeerAddr}
	return nil
}

func nextCall(t *testing.T, w *recordingWriter) leaseCall {
	t.Helper()
	select {
	case c := <-w.calls:
		sort.Strings(c.nodes)
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no lease call")
	}
	return leaseCall{}
}

// TestLeaseKeeper: a tunnel's lease is written when it registers (not at
// the next renewal), every lease is renewed each interval on the clock,
// a tunnel that goes has its lease deleted, and Close deletes the rest.
func TestLeaseKeeper(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ts := &fakeTunnelSet{uuids: map[string]bool{}}
	w := &recordingWriter{calls: make(chan leaseCall, 16)}
	k, err := NewLeaseKeeper(LeaseKeeperConfig{Tunnels: ts, Writer: w, PeerAddr: "10.0.0.1:3021", Deps: observe.Deps{Clock: clock}})
	require.NoError(t, err)

	ts.set("n1", true)
	require.Equal(t, leaseCall{"upsert", []string{"n1"}, "10.0.0.1:3021"}, nextCall(t, w))
	ts.set("n2", true)
	require.Equal(t, leaseCall{"upsert", []string{"n2"}, "10.0.0.1:3021"}, nextCall(t, w))

	require.NoError(t, clock.BlockUntilContext(context.Background(), 1))
	clock.Advance(2 * time.Second)
	require.Equal(t, leaseCall{"upsert", []string{"n1", "n2"}, "10.0.0.1:3021"}, nextCall(t, w))

	ts.set("n1", false)
	require.Equal(t, leaseCall{"delete", []string{"n1"}, ""}, nextCall(t, w))

	require.NoError(t, k.Close(context.Background()))
	require.Equal(t, leaseCall{"delete", []string{"n2"}, ""}, nextCall(t, w))
	select {
	case c := <-w.calls:
		t.Fatalf("unexpected call after Close: %+v", c)
	default:
	}
}

// TestLeaseKeeperLeaves: the leaf tunnels this proxy holds are leased
// with the node tunnels (by their services.LeafTunnelID), as soon as one
// registers, renewed with the rest, and deleted when it goes: nothing
// but the registries' contents is ever leased.
func TestLeaseKeeperLeaves(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ts := &fakeTunnelSet{uuids: map[string]bool{}}
	leaves := &fakeTunnelSet{uuids: map[string]bool{}}
	w := &recordingWriter{calls: make(chan leaseCall, 16)}
	k, err := NewLeaseKeeper(LeaseKeeperConfig{Tunnels: ts, Leaves: leaves, Writer: w, PeerAddr: "10.0.0.1:3021", Deps: observe.Deps{Clock: clock}})
	require.NoError(t, err)

	leaves.set(services.LeafTunnelID("Leaf"), true)
	require.Equal(t, leaseCall{"upsert", []string{"leaf:leaf"}, "10.0.0.1:3021"}, nextCall(t, w))
	ts.set("n1", true)
	require.Equal(t, leaseCall{"upsert", []string{"n1"}, "10.0.0.1:3021"}, nextCall(t, w))

	require.NoError(t, clock.BlockUntilContext(context.Background(), 1))
	clock.Advance(2 * time.Second)
	require.Equal(t, leaseCall{"upsert", []string{"leaf:leaf", "n1"}, "10.0.0.1:3021"}, nextCall(t, w))

	leaves.set("leaf:leaf", false)
	require.Equal(t, leaseCall{"delete", []string{"leaf:leaf"}, ""}, nextCall(t, w))
	require.NoError(t, k.Close(context.Background()))
	require.Equal(t, leaseCall{"delete", []string{"n1"}, ""}, nextCall(t, w))
}
