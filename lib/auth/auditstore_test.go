package auth

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/backend/memory"
	backendtest "github.com/postern-dev/postern/lib/backend/test"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
)

func metricValue(t *testing.T, reg *prometheus.Registry, name, sink string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "sink" && lp.GetValue() == sink {
					if g := m.GetGauge(); g != nil {
						return g.GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// settleLog flushes l, advancing clock past every backoff meanwhile.
func settleLog(t *testing.T, l *events.Log, clock *clockwork.FakeClock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.Flush(ctx) }()
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		default:
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err := clock.BlockUntilContext(wctx, 1)
		wcancel()
		if err == nil {
			clock.Advance(events.DefaultRetryMax)
		}
		require.NoError(t, ctx.Err(), "the audit log did not settle")
	}
}

// TestShippedEventsAckedOnlyWhenStored: a node ships to a real auth API
// server whose backend (its audit log's) is down. Auth answers the batch
// with a ConnectionProblem instead of acknowledging what it only queued;
// the node keeps the events and retries with backoff; once the backend is
// back every event is stored exactly once (auth's own copy, written from
// its file after the outage, is skipped), and both sides' pending gauges
// return to 0.
func TestShippedEventsAckedOnlyWhenStored(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	store := newTestStore(t, clock)
	mem, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	bk := backendtest.NewOutage(mem)                   // etcd without a quorum, for the audit log
	authClock := clockwork.NewFakeClockAt(clock.Now()) // the audit logs' own: their timers alone
	authReg := prometheus.NewRegistry()
	authLog, err := events.NewEmitter(events.Config{
		Dir: filepath.Join(t.TempDir(), "auth-log"), Backend: bk, ClusterName: testCluster,
		Clock: authClock, Logger: testLogger(), Metrics: authReg,
	})
	require.NoError(t, err)
	adminDir := filepath.Join(t.TempDir(), "admin")
	srv, err := NewServer(ServerConfig{
		Store: store, ClusterName: testCluster, AdminIdentityDir: adminDir,
		BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Logger: testLogger(), Audit: authLog}, AuditLog: authLog,
	})
	require.NoError(t, err)
	env := &testEnv{clock: clock, store: store, auth: srv, adminDir: adminDir}
	startAPI(t, env)
	node := env.client(t, env.identity(t, "node-a", RoleNode))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	bk.Down()
	// The answer itself: a retryable ConnectionProblem, not a refusal.
	err = node.ShipEvents(ctx, []events.Event{{Type: events.SessionStart, ID: "direct", User: "direct", Time: clock.Now()}})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)

	nodeClock := clockwork.NewFakeClockAt(clock.Now())
	nodeReg := prometheus.NewRegistry()
	nodeLog, err := events.NewEmitter(events.Config{
		Dir: filepath.Join(t.TempDir(), "node-log"), Remote: node, ClusterName: testCluster,
		Clock: nodeClock, Logger: testLogger(), Metrics: nodeReg, BatchSize: 4,
	})
	require.NoError(t, err)
	const n = 10
	for i := 0; i < n; i++ {
		nodeLog.Emit(ctx, events.Event{Type: events.SessionStart, User: fmt.Sprint("u", i),
			Fields: events.Fields{events.FieldSessionID: fmt.Sprint("s", i)}})
	}
	// The shipper fails, then waits on its backoff; a retry fails again.
	require.NoError(t, nodeClock.BlockUntilContext(ctx, 1))
	require.GreaterOrEqual(t, metricValue(t, nodeReg, "postern_audit_write_errors_total", "remote"), 1.0)
	nodeClock.Advance(events.DefaultRetryMin)
	require.NoError(t, nodeClock.BlockUntilContext(ctx, 1))
	require.Equal(t, float64(n), metricValue(t, nodeReg, "postern_audit_pending", "remote"))
	require.Greater(t, metricValue(t, authReg, "postern_audit_pending", "backend"), 0.0)
	items, err := mem.GetRange(ctx, "/events/", 0)
	require.NoError(t, err)
	require.Empty(t, items)

	bk.Up()
	settleLog(t, nodeLog, nodeClock)
	require.Zero(t, metricValue(t, nodeReg, "postern_audit_pending", "remote"))
	require.Zero(t, metricValue(t, nodeReg, "postern_audit_dropped_total", "remote"))
	settleLog(t, authLog, authClock)
	require.Zero(t, metricValue(t, authReg, "postern_audit_pending", "backend"))

	items, err = mem.GetRange(ctx, "/events/", 0)
	require.NoError(t, err)
	seen := map[string]int{}
	for _, it := range items {
		var e events.Event
		require.NoError(t, e.UnmarshalJSON(it.Value))
		require.Equal(t, "node-a", e.Fields[events.FieldEmitterID])
		seen[e.User]++
	}
	want := map[string]int{"direct": 1}
	for i := 0; i < n; i++ {
		want[fmt.Sprint("u", i)] = 1
	}
	require.Equal(t, want, seen, "every event once (the refused direct batch reached auth's file, so auth stored it after the outage)")
	require.NoError(t, nodeLog.Close())
	require.NoError(t, authLog.Close())
}
