package auth

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// recordingAnnouncer keeps every node it is given and fails on demand.
type recordingAnnouncer struct {
	mu    sync.Mutex
	nodes []services.Node
	fail  error
}

func (r *recordingAnnouncer) UpsertNode(_ context.Context, n services.Node) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes = append(r.nodes, n)
	return r.fail
}

func (r *recordingAnnouncer) last() (services.Node, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[len(r.nodes)-1], len(r.nodes)
}

func (r *recordingAnnouncer) setFail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = err
}

func TestHeartbeat(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ann := &recordingAnnouncer{}
	hb, err := NewHeartbeat(HeartbeatConfig{
		Announcer: ann,
		GetNode:   func() services.Node { return services.Node{UUID: "n1", Hostname: "web"} },
		Deps:      observe.Deps{Clock: clock, Logger: testLogger()},
	})
	require.NoError(t, err)
	go hb.Run()
	defer func() {
		hb.Close()
		<-hb.Done()
	}()

	waitBeat := func() error {
		t.Helper()
		select {
		case err := <-hb.Announced():
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no heartbeat")
		}
		return nil
	}
	// Immediately on start.
	require.NoError(t, waitBeat())
	node, n := ann.last()
	require.Equal(t, 1, n)
	require.Equal(t, "n1", node.UUID)
	require.Equal(t, clock.Now().UTC(), node.LastHeartbeat)
	require.Equal(t, clock.Now().Add(3*DefaultHeartbeatInterval).UTC(), node.Expires)

	// Then every interval, not before.
	clock.Advance(DefaultHeartbeatInterval - time.Second)
	select {
	case <-hb.Announced():
		t.Fatal("heartbeat before the interval")
	default:
	}
	clock.Advance(time.Second)
	require.NoError(t, waitBeat())
	node, n = ann.last()
	require.Equal(t, 2, n)
	require.Equal(t, clock.Now().Add(3*DefaultHeartbeatInterval).UTC(), node.Expires)

	// A failure is reported and the next tick tries again.
	ann.setFail(trace.ConnectionProblem(nil, "auth down"))
	clock.Advance(DefaultHeartbeatInterval)
	require.True(t, trace.IsConnectionProblem(waitBeat()))
	ann.setFail(nil)
	clock.Advance(DefaultHeartbeatInterval)
	require.NoError(t, waitBeat())
	_, n = ann.last()
	require.Equal(t, 4, n)

	require.NoError(t, hb.Close())
	select {
	case <-hb.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Close")
	}
}

func TestHeartbeatConfig(t *testing.T) {
	ann := &recordingAnnouncer{}
	get := func() services.Node { return services.Node{} }
	_, err := NewHeartbeat(HeartbeatConfig{GetNode: get})
	require.True(t, trace.IsBadParameter(err))
	_, err = NewHeartbeat(HeartbeatConfig{Announcer: ann})
	require.True(t, trace.IsBadParameter(err))
	_, err = NewHeartbeat(HeartbeatConfig{Announcer: ann, GetNode: get, Interval: time.Minute, TTL: time.Minute})
	require.True(t, trace.IsBadParameter(err))
	hb, err := NewHeartbeat(HeartbeatConfig{Announcer: ann, GetNode: get, Interval: time.Second})
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, hb.cfg.TTL)
	require.NoError(t, hb.Close())
	require.NoError(t, hb.Run()) // closed before start: returns at once
}

// TestHeartbeatThroughAPI announces over the wire with a node identity,
// and the record expires on the backend when heartbeats stop.
func TestHeartbeatThroughAPI(t *testing.T) {
	env := newTestAPI(t)
	hn := env.newHostNode(t, "hb-node", RoleNode)
	node := env.client(t, hn.id)
	hb, err := NewHeartbeat(HeartbeatConfig{
		Announcer: node,
		GetNode: func() services.Node {
			return services.Node{UUID: "hb-node", Hostname: "hb", Addr: hn.addr}
		},
		Deps: observe.Deps{Clock: env.clock, Logger: testLogger()},
	})
	require.NoError(t, err)
	go hb.Run()
	require.NoError(t, <-hb.Announced())
	hb.Close()
	<-hb.Done()
	ctx := context.Background()
	got, err := env.store.GetNode(ctx, testCluster, "hb-node")
	require.NoError(t, err)
	require.Equal(t, "hb", got.Hostname)
	env.clock.Advance(3 * DefaultHeartbeatInterval)
	_, err = env.store.GetNode(ctx, testCluster, "hb-node")
	require.True(t, trace.IsNotFound(err), "%v", err)
}
