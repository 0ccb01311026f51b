package srv

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// lockEnv is a node server enforcing a real LockWatcher over a memory
// backend: writing a lock to the store is what `pctl lock` does.
type lockEnv struct {
	*testEnv
	store *services.Store
	locks *services.LockWatcher
}

func newLockEnv(t *testing.T, opts ...func(*Config)) *lockEnv {
	t.Helper()
	b, err := memory.New(memory.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	store := services.NewStore(b)
	w, err := services.NewLockWatcher(services.LockWatcherConfig{Events: store})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.WaitSynced(ctx))
	e := newTestEnv(t, append([]func(*Config){func(c *Config) { c.Locks = w }}, opts...)...)
	// Registered after the server's cleanup, so it runs first: the
	// server's lock loop must not depend on the watcher staying open.
	t.Cleanup(func() { w.Close() })
	return &lockEnv{testEnv: e, store: store, locks: w}
}

// lock writes a lock and waits until the server's watcher has it.
func (e *lockEnv) lock(t *testing.T, l services.Lock) {
	t.Helper()
	changed := e.locks.Changes()
	require.NoError(t, e.store.UpsertLock(context.Background(), l))
	for !services.IsLocked(e.locks.Check(l.Target)) {
		select {
		case <-changed:
			changed = e.locks.Changes()
		case <-time.After(10 * time.Second):
			t.Fatal("lock never reached the watcher")
		}
	}
}

func (e *lockEnv) unlock(t *testing.T, target services.LockTarget) {
	t.Helper()
	changed := e.locks.Changes()
	require.NoError(t, e.store.DeleteLock(context.Background(), target))
	for e.locks.Check(target) != nil {
		select {
		case <-changed:
			changed = e.locks.Changes()
		case <-time.After(10 * time.Second):
			t.Fatal("unlock never reached the watcher")
		}
	}
}

// dialWithBanner dials and returns what the server sent as a banner.
func (e *lockEnv) dialWithBanner(login string, s ssh.Signer) (*ssh.Client, string, error) {
	cfg := e.clientConfig(login, s)
	var mu sync.Mutex
	var banner string
	cfg.BannerCallback = func(msg string) error {
		mu.Lock()
		defer mu.Unlock()
		banner += msg
		return nil
	}
	c, err := ssh.Dial("tcp", e.addr, cfg)
	mu.Lock()
	defer mu.Unlock()
	return c, banner, err
}

// TestLockRefusesNewConnections: a locked user, or any user on a locked
// node, is refused at authentication with the lock's message as a banner;
// unlocking restores access.
func TestLockRefusesNewConnections(t *testing.T) {
	e := newLockEnv(t)
	c := e.dial()
	_, _, err := run(t, c, "true")
	require.NoError(t, err)
	c.Close()

	e.lock(t, services.Lock{Target: services.LockTarget{User: "alice"}, Message: "incident 42"})
	_, banner, err := e.dialWithBanner(e.me, e.signer(e.me))
	require.Error(t, err)
	require.Contains(t, banner, "postern: access for user alice is locked: incident 42")
	e.requireLog("Access denied.", "is locked")

	// Another user is not concerned.
	bob := e.userCA.UserSigner(t, srvtest.UserCert{User: "bob", Logins: []string{e.me}, Cluster: testCluster, Now: e.clock.Now()})
	c, _, err = e.dialWithBanner(e.me, bob)
	require.NoError(t, err)
	c.Close()

	e.unlock(t, services.LockTarget{User: "alice"})
	c = e.dial()
	c.Close()

	// A node lock refuses everyone on this node.
	e.lock(t, services.Lock{Target: services.LockTarget{Node: e.node.UUID}, Message: "maintenance"})
	_, banner, err = e.dialWithBanner(e.me, bob)
	require.Error(t, err)
	require.Contains(t, banner, "postern: node "+e.node.UUID+" is locked: maintenance")
}

// TestLockEndsOpenConnections is the ControlMaster case: a connection
// opened before the lock, with a shell running, ends within the lock's
// propagation, and its session reads why on stderr. Connections of other
// users stay up.
func TestLockEndsOpenConnections(t *testing.T) {
	e := newLockEnv(t)
	alice := e.dial()
	sess, err := alice.NewSession()
	require.NoError(t, err)
	stderr, err := sess.StderrPipe()
	require.NoError(t, err)
	errOut := watchOutput(stderr)
	require.NoError(t, sess.Start("sleep 600"))

	bob := e.userCA.UserSigner(t, srvtest.UserCert{User: "bob", Logins: []string{e.me}, Cluster: testCluster, Now: e.clock.Now()})
	other, err := e.dialAs(e.me, bob)
	require.NoError(t, err)
	defer other.Close()

	ended := make(chan error, 1)
	go func() { ended <- alice.Wait() }()
	e.lock(t, services.Lock{Target: services.LockTarget{User: "alice"}, Message: "incident 42"})
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the locked user's open connection was not ended")
	}
	require.Contains(t, errOut.waitFor(t, "incident 42"), "postern: access for user alice is locked: incident 42")
	e.requireLog("Ending a locked connection.")

	_, _, err = run(t, other, "true")
	require.NoError(t, err, "another user's connection must survive")
}

// staticLocks is a LockChecker whose set changes without notifying, so a
// test can see the per-channel check on its own (the sweep would end the
// connection first).
type staticLocks struct {
	mu     sync.Mutex
	locked map[services.LockTarget]services.Lock
	never  chan struct{}
}

func (s *staticLocks) Check(targets ...services.LockTarget) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range targets {
		if l, ok := s.locked[t]; ok {
			return &services.LockedError{Lock: l}
		}
	}
	return nil
}

func (s *staticLocks) Changes() <-chan struct{} { return s.never }

func (s *staticLocks) set(l services.Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.locked[l.Target] = l
}

// TestLockRefusesChannelsOnOpenConnection: every new session or
// direct-tcpip channel on a connection opened before the lock is refused
// with the lock's message.
func TestLockRefusesChannelsOnOpenConnection(t *testing.T) {
	locks := &staticLocks{locked: map[services.LockTarget]services.Lock{}, never: make(chan struct{})}
	e := newTestEnv(t, func(c *Config) { c.Locks = locks })
	c := e.dial()
	_, _, err := run(t, c, "true")
	require.NoError(t, err)

	locks.set(services.Lock{Target: services.LockTarget{User: "alice"}, Message: "incident 42"})
	_, err = c.NewSession()
	var oce *ssh.OpenChannelError
	require.ErrorAs(t, err, &oce)
	require.Equal(t, ssh.Prohibited, oce.Reason)
	require.Equal(t, "postern: access for user alice is locked: incident 42", oce.Message)
	_, err = c.Dial("tcp", "127.0.0.1:1")
	require.ErrorAs(t, err, &oce)
	require.Contains(t, oce.Message, "is locked")
}

// TestLocksNotLoadedRefuse: until the lock set is loaded nobody is let in
// (deny by default), with a message saying so.
func TestLocksNotLoadedRefuse(t *testing.T) {
	b, err := memory.New(memory.Config{})
	require.NoError(t, err)
	defer b.Close()
	// A watcher whose load fails forever: the lock set is never known.
	w, err := services.NewLockWatcher(services.LockWatcherConfig{Events: failingLocks{services.NewStore(b)}, Clock: clockwork.NewFakeClock()})
	require.NoError(t, err)
	defer w.Close()
	e := &lockEnv{testEnv: newTestEnv(t, func(c *Config) { c.Locks = w })}
	_, banner, err := e.dialWithBanner(e.me, e.signer(e.me))
	require.Error(t, err)
	require.Contains(t, banner, "lock list is not loaded yet")
}

type failingLocks struct{ *services.Store }

func (failingLocks) GetLocks(context.Context) ([]services.Lock, error) {
	return nil, context.DeadlineExceeded
}
