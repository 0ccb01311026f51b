package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// TestDialHostRefusesLockedNode: a locked node is never dialed; the user
// who may reach it learns why, and one who may not still sees the RBAC
// refusal (the lock is checked after Authorize).
func TestDialHostRefusesLockedNode(t *testing.T) {
	ctx := context.Background()
	dialer := &recordingDialer{}
	env := newRouterEnv(t, []services.Node{node("n1", "web1", "127.0.0.1:7", 0)}, dialer)
	locks, err := services.NewLockWatcher(services.LockWatcherConfig{Events: env.store, Clock: clockwork.NewRealClock()})
	require.NoError(t, err)
	defer locks.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, locks.WaitSynced(wctx))
	r, err := NewRouter(RouterConfig{ClusterName: testCluster, NodeWatcher: env.watcher, Networking: env.store, Dialer: dialer, Locks: locks, Deps: observe.Deps{Clock: env.clock}})
	require.NoError(t, err)

	changed := locks.Changes()
	require.NoError(t, env.store.UpsertLock(ctx, services.Lock{Target: services.LockTarget{Node: "n1"}, Message: "maintenance"}))
	select {
	case <-changed:
	case <-wctx.Done():
		t.Fatal("lock never arrived")
	}
	_, route, err := r.DialHost(ctx, RouteRequest{Target: Target{Host: "web1"}})
	require.True(t, services.IsLocked(err), "%v", err)
	require.Equal(t, "postern: node n1 is locked: maintenance", trace.UserMessage(err))
	require.Equal(t, "n1", route.Node.UUID)

	_, _, err = r.DialHost(ctx, RouteRequest{Target: Target{Host: "web1"}, Authorize: func(services.Node) error {
		return trace.AccessDenied("no")
	}})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.Empty(t, dialer.addrs(), "a locked node must not be dialed")
}
