package services

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
)

// TestAccessCache: roles and CAs are served from memory and follow the
// backend's events (a role edited, deleted, created after start); private
// keys are never held.
func TestAccessCache(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)
	role := &Role{Metadata: Metadata{Name: "dev"}, Spec: RoleSpec{Logins: []string{"alice"}, NodeLabels: map[string]LabelValues{"env": {"dev"}}}}
	require.NoError(t, s.UpsertRole(ctx, role))
	require.NoError(t, s.CreateCertAuthority(ctx, CertAuthority{Type: UserCA, ClusterName: "c1",
		SSHPublicKeys:  []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBkUbBvYpgJ5bDcrnYi2dDpSTR0oXEJnB5ZUP9wEFwXO"},
		SSHPrivateKeys: [][]byte{[]byte("secret")}}))

	c, err := NewAccessCache(AccessCacheConfig{Events: s, Clock: clock})
	require.NoError(t, err)
	defer c.Close()
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, c.WaitSynced(waitCtx))

	got, err := c.GetRole(ctx, "dev")
	require.NoError(t, err)
	require.Equal(t, []string{"alice"}, got.Spec.Logins)
	_, err = c.GetRole(ctx, "nope")
	require.True(t, trace.IsNotFound(err), "%v", err)

	ca, err := c.GetCertAuthority(ctx, "c1", UserCA, false)
	require.NoError(t, err)
	require.Len(t, ca.SSHPublicKeys, 1)
	require.Empty(t, ca.SSHPrivateKeys, "the cache holds no private keys")
	_, err = c.GetCertAuthority(ctx, "c1", UserCA, true)
	require.True(t, trace.IsBadParameter(err), "%v", err)
	_, err = c.GetCertAuthority(ctx, "c1", HostCA, false)
	require.True(t, trace.IsNotFound(err), "%v", err)

	// An edit reaches the cache by its event (no read on the way).
	role.Spec.Logins = []string{"bob"}
	require.NoError(t, s.UpsertRole(ctx, role))
	require.EventuallyWithT(t, func(ct *assertCollect) {
		got, err := c.GetRole(ctx, "dev")
		if assertNoError(ct, err) {
			assertElementsMatch(ct, []string{"bob"}, got.Spec.Logins)
		}
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, s.UpsertRole(ctx, &Role{Metadata: Metadata{Name: "ops"}}))
	require.NoError(t, s.DeleteRole(ctx, "dev"))
	require.Eventually(t, func() bool {
		_, errDev := c.GetRole(ctx, "dev")
		_, errOps := c.GetRole(ctx, "ops")
		return trace.IsNotFound(errDev) && errOps == nil
	}, 10*time.Second, 5*time.Millisecond)
}

// TestAccessCacheNotLoaded: before the first load, and while the watch is
// broken, it refuses (ConnectionProblem) rather than answer "no roles".
func TestAccessCacheNotLoaded(t *testing.T) {
	rw := &ResourceWatcher[*Role]{synced: make(chan struct{}), done: make(chan struct{}), cfg: ResourceWatcherConfig[*Role]{Name: "roles"}}
	c := &AccessCache{roles: rw, rc: newMapCollector(func(r *Role) string { return r.Metadata.Name }),
		stale: &staleness{view: "roles", clock: clockwork.NewFakeClock(), log: logrus.New()}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := c.GetRole(ctx, "dev")
	require.True(t, trace.IsConnectionProblem(err), "%v", err)

	close(rw.synced)
	rw.setHealth(trace.ConnectionProblem(nil, "roles watch broke"))
	_, err = c.GetRole(context.Background(), "dev")
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
}

// TestAccessCacheTrustedClusters: the roots a leaf trusts are served from
// memory without their tokens, and a deletion reaches the cache by its
// event (what cuts a root's users off within seconds).
func TestAccessCacheTrustedClusters(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)
	tc := &TrustedCluster{Metadata: Metadata{Name: "root"}, Spec: TrustedClusterSpec{
		Enabled: true, ProxyAddr: "root:3080", Token: "abc@" + testPin,
		RoleMap: RoleMap{{Remote: "access", Local: []string{"dev"}}},
	}}
	require.NoError(t, s.UpsertTrustedCluster(ctx, tc))
	c, err := NewAccessCache(AccessCacheConfig{Events: s, Clock: clock})
	require.NoError(t, err)
	defer c.Close()
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, c.WaitSynced(waitCtx))

	got, err := c.GetTrustedCluster(ctx, "root")
	require.NoError(t, err)
	require.Empty(t, got.Spec.Token, "the cache holds no token")
	require.Equal(t, tc.Spec.RoleMap, got.Spec.RoleMap)
	_, err = c.GetTrustedCluster(ctx, "other")
	require.True(t, trace.IsNotFound(err), "%v", err)

	tc.Spec.Enabled = false
	require.NoError(t, s.UpsertTrustedCluster(ctx, tc))
	require.Eventually(t, func() bool {
		got, err := c.GetTrustedCluster(ctx, "root")
		return err == nil && !got.Spec.Enabled && got.Spec.Token == ""
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, s.DeleteTrustedCluster(ctx, "root"))
	require.Eventually(t, func() bool {
		_, err := c.GetTrustedCluster(ctx, "root")
		return trace.IsNotFound(err)
	}, 10*time.Second, 5*time.Millisecond)
}

// TestAccessCacheTrustChanges: a trusted cluster's deletion and a CA's
// change each close the channel TrustChanges handed out before them (the
// SSH servers' trust sweep waits on it); the view is current when it
// closes.
func TestAccessCacheTrustChanges(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)
	tc := &TrustedCluster{Metadata: Metadata{Name: "root"}, Spec: TrustedClusterSpec{Enabled: true, ProxyAddr: "root:3080", Token: "abc@" + testPin, RoleMap: RoleMap{{Remote: "access", Local: []string{"dev"}}}}}
	require.NoError(t, s.UpsertTrustedCluster(ctx, tc))
	c, err := NewAccessCache(AccessCacheConfig{Events: s, Clock: clock})
	require.NoError(t, err)
	defer c.Close()
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, c.WaitSynced(waitCtx))
	closed := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("TrustChanges was not closed by %s", what)
		}
	}

	ch := c.TrustChanges()
	require.NoError(t, s.DeleteTrustedCluster(ctx, "root"))
	closed(ch, "the trusted_cluster's deletion")
	_, err = c.GetTrustedCluster(ctx, "root")
	require.True(t, trace.IsNotFound(err), "%v", err)

	ch = c.TrustChanges()
	require.NoError(t, s.CreateCertAuthority(ctx, CertAuthority{Type: UserCA, ClusterName: "root",
		SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBkUbBvYpgJ5bDcrnYi2dDpSTR0oXEJnB5ZUP9wEFwXO"}}))
	closed(ch, "a new CA")
	_, err = c.GetCertAuthority(ctx, "root", UserCA, false)
	require.NoError(t, err)
}

// TestAccessCacheStaleGrace: with a grace, a watch that was live and broke
// is answered from the last view for that long on the cache's clock, then
// refused; a fresh break starts a fresh grace; without one (the default)
// it refuses at once.
func TestAccessCacheStaleGrace(t *testing.T) {
	clock := clockwork.NewFakeClock()
	rw := &ResourceWatcher[*Role]{synced: make(chan struct{}), done: make(chan struct{}), cfg: ResourceWatcherConfig[*Role]{Name: "roles", Clock: clock}}
	rc := newMapCollector(func(r *Role) string { return backend.Key(rolesPrefix, r.Metadata.Name) })
	rc.Reset([]*Role{{Metadata: Metadata{Name: "dev"}}})
	close(rw.synced)
	rw.setHealth(nil)
	strict := &AccessCache{roles: rw, rc: rc, stale: &staleness{view: "roles", clock: clock, log: logrus.New()}}
	lenient := &AccessCache{roles: rw, rc: rc, stale: &staleness{view: "roles", max: 5 * time.Second, clock: clock, log: logrus.New()}}
	ctx := context.Background()

	_, err := lenient.GetRole(ctx, "dev")
	require.NoError(t, err)
	rw.setHealth(trace.ConnectionProblem(nil, "roles watch broke"))
	_, err = strict.GetRole(ctx, "dev")
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	clock.Advance(time.Second)
	_, err = lenient.GetRole(ctx, "dev")
	require.NoError(t, err, "within the grace: the last view")
	// A second failure while re-syncing does not restart the grace.
	rw.setHealth(trace.ConnectionProblem(nil, "re-sync failed"))
	clock.Advance(4 * time.Second)
	_, err = lenient.GetRole(ctx, "dev")
	require.True(t, trace.IsConnectionProblem(err), "past the grace: refused: %v", err)

	rw.setHealth(nil)
	rw.setHealth(trace.ConnectionProblem(nil, "broke again"))
	_, err = lenient.GetRole(ctx, "dev")
	require.NoError(t, err, "a new break, a new grace")
}
