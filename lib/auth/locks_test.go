package auth

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// TestLocksOverTheWire: admins write and lift locks; nodes and proxies
// read and watch them and may not write them.
func TestLocksOverTheWire(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	admin := env.adminClient(t)
	node := env.client(t, env.identity(t, "node-a", RoleNode))
	proxy := env.client(t, env.identity(t, "proxy-a", RoleProxy))

	l, err := admin.UpsertLock(ctx, authapi.LockRequest{Target: services.LockTarget{User: "bob"}, Message: "incident 42", TTL: services.Duration(time.Minute)})
	require.NoError(t, err)
	require.Equal(t, "incident 42", l.Message)
	require.Equal(t, env.clock.Now().UTC().Add(time.Minute), l.Expires)
	require.Contains(t, l.CreatedBy, RoleAdmin)

	_, err = admin.UpsertLock(ctx, authapi.LockRequest{Target: services.LockTarget{User: "bob"}, TTL: services.Duration(-time.Second)})
	requireKind(t, err, trace.IsBadParameter, "lock ttl")
	_, err = admin.UpsertLock(ctx, authapi.LockRequest{Target: services.LockTarget{User: "bob"}, Message: "\x1b]0;owned\a"})
	requireKind(t, err, trace.IsBadParameter, "control character")

	for _, c := range []*Client{node, proxy, admin} {
		locks, err := c.GetLocks(ctx)
		require.NoError(t, err)
		require.Len(t, locks, 1)
		require.Equal(t, services.LockTarget{User: "bob"}, locks[0].Target)
	}
	for _, c := range []*Client{node, proxy} {
		_, err := c.UpsertLock(ctx, authapi.LockRequest{Target: services.LockTarget{User: "alice"}})
		requireKind(t, err, trace.IsAccessDenied, "may not call")
		requireKind(t, c.DeleteLock(ctx, services.LockTarget{User: "bob"}), trace.IsAccessDenied, "may not call")
	}

	// The lock stream serves the locks prefix and nothing else: a node
	// cannot use it to watch users (password hashes) or anything else.
	_, err = node.LockEvents().NewWatcher(ctx, backend.Watch{Prefixes: []string{"/users/"}})
	requireKind(t, err, trace.IsAccessDenied, "outside")

	// A node's LockWatcher runs on the API: a lock written later arrives.
	w, err := services.NewLockWatcher(services.LockWatcherConfig{Events: node.LockEvents(), Clock: env.clock, Logger: testLogger()})
	require.NoError(t, err)
	defer w.Close()
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, w.WaitSynced(waitCtx))
	require.True(t, services.IsLocked(w.Check(services.LockTarget{User: "bob"})))
	changed := w.Changes()
	_, err = admin.UpsertLock(ctx, authapi.LockRequest{Target: services.LockTarget{Node: "node-b"}})
	require.NoError(t, err)
	select {
	case <-changed:
	case <-waitCtx.Done():
		t.Fatal("the lock never reached the node's watcher")
	}
	require.True(t, services.IsLocked(w.Check(services.LockTarget{Node: "node-b"})))

	require.NoError(t, admin.DeleteLock(ctx, services.LockTarget{Node: "node-b"}))
	requireKind(t, admin.DeleteLock(ctx, services.LockTarget{Node: "node-b"}), trace.IsNotFound, "no lock")
	requireKind(t, admin.DeleteLock(ctx, services.LockTarget{}), trace.IsBadParameter, "empty")
}

// TestDeleteUserLocksAndLockRefusesCerts: deleting a user writes a lock
// that outlives every certificate issued before; a locked user gets no new
// certificate, by login or by pctl auth sign.
func TestDeleteUserLocksAndLockRefusesCerts(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "alice", []byte("secret-pw"), []string{"alice"}, nil, false)
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	_, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "alice", PublicKey: pub})
	require.NoError(t, err)

	_, err = env.auth.UpsertLock(ctx, authapi.LockRequest{Target: services.LockTarget{User: "alice"}, Message: "incident 42"}, "admin")
	require.NoError(t, err)
	_, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "alice", PublicKey: pub})
	requireKind(t, err, trace.IsAccessDenied, "access for user alice is locked: incident 42")
	_, err = env.auth.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{AuthRequest: authapi.AuthRequest{User: "alice", Password: "secret-pw", RemoteAddr: "198.51.100.1:1"}, PublicKey: pub})
	requireKind(t, err, trace.IsAccessDenied, "is locked")
	require.NoError(t, env.auth.DeleteLock(ctx, services.LockTarget{User: "alice"}))
	_, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "alice", PublicKey: pub})
	require.NoError(t, err)

	require.NoError(t, env.auth.DeleteUser(ctx, "alice"))
	l, err := env.store.GetLock(ctx, services.LockTarget{User: "alice"})
	require.NoError(t, err)
	require.Equal(t, "the user was deleted", l.Message)
	require.Equal(t, env.clock.Now().UTC().Add(services.DefaultMaxSessionTTL+clockSkew), l.Expires)

	// Deleting a user who does not exist writes no lock.
	requireKind(t, env.auth.DeleteUser(ctx, "nobody"), trace.IsNotFound, "not found")
	_, err = env.store.GetLock(ctx, services.LockTarget{User: "nobody"})
	require.True(t, trace.IsNotFound(err))
}
