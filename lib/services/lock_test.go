package services

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

func TestLockValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock Lock
		want string
	}{
		{"empty target", Lock{}, "lock target is empty"},
		{"both", Lock{Target: LockTarget{User: "alice", Node: "n1"}}, "both a user and a node"},
		{"bad user", Lock{Target: LockTarget{User: "-alice"}}, "must start with a letter"},
		{"slash in node", Lock{Target: LockTarget{Node: "a/b"}}, "not allowed"},
		{"escape in message", Lock{Target: LockTarget{User: "alice"}, Message: "hi\x1b[2J"}, "control character"},
		{"newline in message", Lock{Target: LockTarget{User: "alice"}, Message: "a\nb"}, "control character"},
		{"long message", Lock{Target: LockTarget{User: "alice"}, Message: strings.Repeat("x", maxLockMessageLen+1)}, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.lock.CheckAndSetDefaults()
			require.True(t, trace.IsBadParameter(err), "%v", err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	ok := Lock{Target: LockTarget{User: "alice@example.com"}, Message: "incident 42"}
	require.NoError(t, ok.CheckAndSetDefaults())
	require.Equal(t, "postern: access for user alice@example.com is locked: incident 42", ok.Refusal())
	n := Lock{Target: LockTarget{Node: "6b3c"}}
	require.Equal(t, "postern: node 6b3c is locked", n.Refusal())

	_, err := ParseLockTarget("group", "x")
	require.True(t, trace.IsBadParameter(err))
	tg, err := ParseLockTarget(LockTargetNode, "6b3c")
	require.NoError(t, err)
	require.Equal(t, LockTarget{Node: "6b3c"}, tg)
}

func TestLockStore(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)

	_, err := s.GetLock(ctx, LockTarget{User: "alice"})
	require.True(t, trace.IsNotFound(err))
	require.True(t, trace.IsNotFound(s.DeleteLock(ctx, LockTarget{User: "alice"})))

	require.NoError(t, s.UpsertLock(ctx, Lock{Target: LockTarget{User: "alice"}, Message: "one"}))
	// Locking again replaces: one lock per target.
	require.NoError(t, s.UpsertLock(ctx, Lock{Target: LockTarget{User: "alice"}, Message: "two"}))
	require.NoError(t, s.UpsertLock(ctx, Lock{Target: LockTarget{Node: "n1"}, Expires: clock.Now().Add(time.Minute)}))
	locks, err := s.GetLocks(ctx)
	require.NoError(t, err)
	require.Len(t, locks, 2)
	l, err := s.GetLock(ctx, LockTarget{User: "alice"})
	require.NoError(t, err)
	require.Equal(t, "two", l.Message)

	// The TTL is the backend's: the node lock is gone after a minute.
	clock.Advance(time.Minute)
	_, err = s.GetLock(ctx, LockTarget{Node: "n1"})
	require.True(t, trace.IsNotFound(err))

	require.NoError(t, s.DeleteLock(ctx, LockTarget{User: "alice"}))
	locks, err = s.GetLocks(ctx)
	require.NoError(t, err)
	require.Empty(t, locks)

	require.Error(t, s.UpsertLock(ctx, Lock{}))
}

// TestLockWatcher: a lock written to the backend reaches the in-memory set
// with a change notification; deleting or expiring it lifts it.
func TestLockWatcher(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)
	require.NoError(t, s.UpsertLock(ctx, Lock{Target: LockTarget{User: "early"}}))

	w, err := NewLockWatcher(LockWatcherConfig{Events: s, Clock: clock})
	require.NoError(t, err)
	defer w.Close()
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, w.WaitSynced(waitCtx))

	// Loaded at start.
	require.True(t, IsLocked(w.Check(LockTarget{User: "early"})))
	require.NoError(t, w.Check(LockTarget{User: "alice"}, LockTarget{Node: "n1"}, LockTarget{}))

	changed := w.Changes()
	require.NoError(t, s.UpsertLock(ctx, Lock{Target: LockTarget{User: "alice"}, Message: "incident 42"}))
	waitChange(t, changed)
	err = w.Check(LockTarget{Node: "n1"}, LockTarget{User: "alice"})
	require.True(t, IsLocked(err))
	require.False(t, trace.IsAccessDenied(err), "a lock must not be hidden as a plain denial")
	require.Equal(t, "postern: access for user alice is locked: incident 42", err.Error())

	changed = w.Changes()
	require.NoError(t, s.DeleteLock(ctx, LockTarget{User: "alice"}))
	waitChange(t, changed)
	require.NoError(t, w.Check(LockTarget{User: "alice"}))

	// A lock with a TTL stops applying when it expires, even before the
	// backend's delete event lands.
	changed = w.Changes()
	require.NoError(t, s.UpsertLock(ctx, Lock{Target: LockTarget{Node: "n1"}, Expires: clock.Now().Add(time.Minute)}))
	waitChange(t, changed)
	require.True(t, IsLocked(w.Check(LockTarget{Node: "n1"})))
	require.Len(t, w.Locks(), 2)
	clock.Advance(time.Minute)
	require.NoError(t, w.Check(LockTarget{Node: "n1"}))
	require.Len(t, w.Locks(), 1)
}

// TestLockWatcherNotLoaded: before the first load nothing is let through.
func TestLockWatcherNotLoaded(t *testing.T) {
	w := &LockWatcher{w: &ResourceWatcher[Lock]{synced: make(chan struct{})}, c: newLockCollector(), clock: clockwork.NewFakeClock()}
	err := w.Check(LockTarget{User: "alice"})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
}

func waitChange(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no lock set change")
	}
}
