package web

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// newLockedTermEnv is a termEnv whose web server enforces a real
// LockWatcher over the test's backend.
func newLockedTermEnv(t *testing.T) (*termEnv, *services.LockWatcher) {
	t.Helper()
	var locks *services.LockWatcher
	e := newTermEnv(t, func(c *WebSessionsConfig) {
		w, err := services.NewLockWatcher(services.LockWatcherConfig{Events: c.Roles.(*services.Store), Clock: clockwork.NewRealClock(), Logger: quietLogger()})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		require.NoError(t, w.WaitSynced(ctx))
		locks = w
		c.Locks = w
	})
	t.Cleanup(func() { locks.Close() })
	return e, locks
}

// TestWebSessionEndsWhenUserDeleted is the attack: alice's cookie and
// token, and her open terminal, outlive `pctl users rm alice` on main.
// Deleting her ends the terminal with the reason, removes the session
// record and refuses the same credentials with 401.
func TestWebSessionEndsWhenUserDeleted(t *testing.T) {
	e, _ := newLockedTermEnv(t)
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")

	require.NoError(t, e.auth.DeleteUser(context.Background(), testUser))
	f := readUntil(t, ctx, c, FrameError, "")
	require.Contains(t, string(f.Payload), "access for user alice is locked: the user was deleted")
	requireClosed(t, ctx, c, closeError, "")
	<-e.node.ended

	resp, body := e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, string(body))
	items, err := e.store.Backend().GetRange(context.Background(), "/web/sessions/", 0)
	require.NoError(t, err)
	require.Empty(t, items, "the deleted user's session record must be gone")
}

// TestWebSessionRefusedWhileLocked: a lock answers the session's next
// request with 401, a new login is refused, and once
// unlocked the user logs in again.
func TestWebSessionRefusedWhileLocked(t *testing.T) {
	e, locks := newLockedTermEnv(t)
	ws := e.login(t)
	ctx := context.Background()

	changed := locks.Changes()
	require.NoError(t, e.store.UpsertLock(ctx, services.Lock{Target: services.LockTarget{User: testUser}, Message: "incident 42"}))
	select {
	case <-changed:
	case <-time.After(testTimeout):
		t.Fatal("lock never arrived")
	}
	resp, body := e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, string(body))

	resp, body = e.do(t, http.MethodPost, "/webapi/sessions", `{"user":"alice","password":"correct horse battery","otp_token":""}`, webSession{}, nil)
	// The password is right, so the login says the user is locked and why
	// (a wrong password would still read "invalid credentials").
	require.Equal(t, http.StatusForbidden, resp.StatusCode, string(body))
	require.Contains(t, string(body), "incident 42")

	changed = locks.Changes()
	require.NoError(t, e.store.DeleteLock(ctx, services.LockTarget{User: testUser}))
	select {
	case <-changed:
	case <-time.After(testTimeout):
		t.Fatal("unlock never arrived")
	}
	ws = e.login(t)
	resp, body = e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
}

// TestWebTerminalEndsWhenItsOpenSSHNodeIsLocked: a stock sshd knows
// nothing of locks, so a lock on the node ends the proxy's terminal to it,
// with the lock's message, and a new one is refused.
func TestWebTerminalEndsWhenItsOpenSSHNodeIsLocked(t *testing.T) {
	e, _ := newLockedTermEnv(t)
	useOpenSSHNode(t, e)
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")

	require.NoError(t, e.store.UpsertLock(context.Background(), services.Lock{Target: services.LockTarget{Node: testNodeUUID}, Message: "maintenance window"}))
	f := readUntil(t, ctx, c, FrameError, "")
	require.Contains(t, string(f.Payload), "maintenance window")
	requireClosed(t, ctx, c, closeError, "")
	<-e.node.ended
}
