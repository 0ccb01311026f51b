package services

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend/memory"
	backendtest "github.com/postern-dev/postern/lib/backend/test"
)

// outageEnv is a store on a memory backend that the test can take down
// and bring back (an etcd losing and regaining its quorum). The backend
// keeps its own clock, so that the views' fake clock has no blocker but
// the watchers' backoff timers.
type outageEnv struct {
	outage *backendtest.Outage
	store  *Store
}

func newOutageEnv(t *testing.T) *outageEnv {
	t.Helper()
	b, err := memory.New(memory.Config{Clock: clockwork.NewFakeClock()})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	o := backendtest.NewOutage(b)
	s := NewStore(o)
	ctx := context.Background()
	require.NoError(t, s.UpsertRole(ctx, &Role{Metadata: Metadata{Name: "dev"}, Spec: RoleSpec{Logins: []string{"alice"}}}))
	require.NoError(t, s.CreateCertAuthority(ctx, CertAuthority{Type: UserCA, ClusterName: "c1",
		SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBkUbBvYpgJ5bDcrnYi2dDpSTR0oXEJnB5ZUP9wEFwXO"}}))
	require.NoError(t, s.UpsertLock(ctx, Lock{Target: LockTarget{User: "mallory"}, Message: "incident 42"}))
	return &outageEnv{outage: o, store: s}
}

// TestAccessViewsThroughOutage is the etcd quorum loss seen by a proxy's
// or node's views: within the bound, CAs and roles answer from the last
// view, the last known locks still deny and everyone else passes, and
// every such answer is counted and logged once; past it everything is
// refused (a ConnectionProblem: "unavailable"), except that a lock still
// says why; and when the backend is back every view is current again
// within 2 s of (fake) time, without a call from the test.
func TestAccessViewsThroughOutage(t *testing.T) {
	const bound = time.Minute
	ctx := context.Background()
	env := newOutageEnv(t)
	clock := clockwork.NewFakeClock()
	logger, hook := logtest.NewNullLogger()
	cache, err := NewAccessCache(AccessCacheConfig{Events: env.store, Clock: clock, Logger: logger, StaleGrace: bound})
	require.NoError(t, err)
	defer cache.Close()
	locks, err := NewLockWatcher(LockWatcherConfig{Events: env.store, Clock: clock, Logger: logger, MaxStale: bound})
	require.NoError(t, err)
	defer locks.Close()
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, cache.WaitSynced(waitCtx))
	require.NoError(t, locks.WaitSynced(waitCtx))

	answers := func() {
		t.Helper()
		_, err := cache.GetRole(ctx, "dev")
		require.NoError(t, err)
		_, err = cache.GetCertAuthority(ctx, "c1", UserCA, false)
		require.NoError(t, err)
		_, err = cache.GetTrustedCluster(ctx, "root")
		require.True(t, trace.IsNotFound(err), "the last view says: no such root: %v", err)
		require.NoError(t, locks.Check(LockTarget{User: "alice"}))
		require.True(t, IsLocked(locks.Check(LockTarget{User: "mallory"})))
	}
	answers()
	require.Zero(t, cache.StaleStats().Answers, "a live view is not stale")

	// The quorum is lost: every watch breaks, every re-sync fails. Four
	// watchers (roles, CAs, trusted clusters, locks) wait on backoff.
	env.outage.Down()
	require.NoError(t, clock.BlockUntilContext(waitCtx, 4))
	require.Error(t, cache.Healthy())
	require.Error(t, locks.Healthy())
	answers()
	clock.Advance(bound - time.Second)
	require.NoError(t, clock.BlockUntilContext(waitCtx, 4))
	answers()
	st := cache.StaleStats()
	require.NotZero(t, st.Answers)
	require.Equal(t, bound-time.Second, st.StaleFor)
	require.NotZero(t, locks.StaleStats().Answers)
	warned := 0
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && e.Message == "Answering from the last view of roles and certificate authorities: its watch is broken and re-syncing." {
			warned++
		}
	}
	// Once for the outage (its three watches broke together), not per
	// answer.
	require.Equal(t, 1, warned)

	// Past the bound: deny by default again.
	clock.Advance(2 * time.Second)
	require.NoError(t, clock.BlockUntilContext(waitCtx, 4))
	_, err = cache.GetRole(ctx, "dev")
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.ErrorContains(t, err, "have not been current for 1m1s")
	_, err = cache.GetCertAuthority(ctx, "c1", UserCA, false)
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	err = locks.Check(LockTarget{User: "alice"})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.False(t, IsLocked(err))
	require.True(t, IsLocked(locks.Check(LockTarget{User: "mallory"})), "a known lock still says why")
	require.NotZero(t, cache.StaleStats().Refusals)
	require.NotZero(t, locks.StaleStats().Refusals)

	// The quorum returns. Each watcher is in a backoff of at most
	// DefaultMaxBackoff (1 s); once it has passed, all are current with
	// no further time passing.
	env.outage.Up()
	clock.Advance(DefaultMaxBackoff)
	require.Eventually(t, func() bool { return cache.Healthy() == nil && locks.Healthy() == nil }, 10*time.Second, time.Millisecond)
	answers()
	require.Zero(t, cache.StaleStats().StaleFor)
	require.Zero(t, locks.StaleStats().StaleFor)

	// A lock written once it is back applies at once, as always.
	require.NoError(t, env.store.UpsertLock(ctx, Lock{Target: LockTarget{User: "alice"}}))
	require.Eventually(t, func() bool { return IsLocked(locks.Check(LockTarget{User: "alice"})) }, 10*time.Second, time.Millisecond)
}

// TestAccessViewsNeverLoaded: a process that starts during the outage has
// no view to answer from, whatever the bound: it refuses.
func TestAccessViewsNeverLoaded(t *testing.T) {
	env := newOutageEnv(t)
	env.outage.Down()
	clock := clockwork.NewFakeClock()
	cache, err := NewAccessCache(AccessCacheConfig{Events: env.store, Clock: clock, StaleGrace: time.Hour})
	require.NoError(t, err)
	defer cache.Close()
	locks, err := NewLockWatcher(LockWatcherConfig{Events: env.store, Clock: clock, MaxStale: time.Hour})
	require.NoError(t, err)
	defer locks.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = cache.GetRole(ctx, "dev")
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	_, err = cache.GetCertAuthority(ctx, "c1", UserCA, false)
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	err = locks.Check(LockTarget{User: "alice"})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.Zero(t, cache.StaleStats().Answers)
}

// TestAccessCacheNoGraceRefusesAtOnce: without a bound (the zero
// config), a broken watch refuses at once: the grace is opt-in.
func TestAccessCacheNoGraceRefusesAtOnce(t *testing.T) {
	env := newOutageEnv(t)
	clock := clockwork.NewFakeClock()
	cache, err := NewAccessCache(AccessCacheConfig{Events: env.store, Clock: clock})
	require.NoError(t, err)
	defer cache.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, cache.WaitSynced(ctx))
	env.outage.Down()
	require.NoError(t, clock.BlockUntilContext(ctx, 3))
	_, err = cache.GetRole(ctx, "dev")
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
}
