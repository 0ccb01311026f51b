package srv

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/backend/memory"
	backendtest "github.com/postern-dev/postern/lib/backend/test"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// lateAccessPoint is an AccessPoint set after the server is built: the
// cache must hold the CA that newTestEnv makes.
type lateAccessPoint struct {
	mu sync.Mutex
	AccessPoint
}

func (l *lateAccessPoint) get() AccessPoint {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.AccessPoint
}

func (l *lateAccessPoint) GetCertAuthority(ctx context.Context, c string, t services.CertAuthType, s bool) (*services.CertAuthority, error) {
	return l.get().GetCertAuthority(ctx, c, t, s)
}

func (l *lateAccessPoint) GetRole(ctx context.Context, name string) (*services.Role, error) {
	return l.get().GetRole(ctx, name)
}

func (l *lateAccessPoint) GetTrustedCluster(ctx context.Context, name string) (*services.TrustedCluster, error) {
	return l.get().GetTrustedCluster(ctx, name)
}

// TestLoginThroughBackendOutage is the etcd quorum loss end to end on the
// SSH ports: a proxy and a node, each checking certificates, roles and
// locks against the production AccessCache and LockWatcher over a backend
// that goes down. A real x/crypto client logs in to the proxy and, through
// it (direct-tcpip, as `ssh -J`), to the node, before, during (answered
// from the last view; a locked user is still refused, with the lock's
// message) and, past the 5-minute bound, is refused with the "auth server
// is unavailable" banner; when the backend is back it gets in again after
// at most one backoff (1 s) of the views' clock.
func TestLoginThroughBackendOutage(t *testing.T) {
	const bound = 5 * time.Minute
	b, err := memory.New(memory.Config{})
	require.NoError(t, err)
	defer b.Close()
	outage := backendtest.NewOutage(b)
	store := services.NewStore(outage)
	ctx := context.Background()
	require.NoError(t, store.UpsertRole(ctx, srvtest.AccessRole()))
	require.NoError(t, store.UpsertLock(ctx, services.Lock{Target: services.LockTarget{User: "mallory"}, Message: "incident 42"}))

	viewClock := clockwork.NewFakeClock()
	locks, err := services.NewLockWatcher(services.LockWatcherConfig{Events: store, Clock: viewClock, MaxStale: bound})
	require.NoError(t, err)
	defer locks.Close()

	ap := &lateAccessPoint{}
	node := newTestEnv(t, func(c *Config) { c.AccessPoint = ap; c.Locks = locks })
	require.NoError(t, store.CreateCertAuthority(ctx, *node.userCA.CertAuthority(testCluster, services.UserCA)))
	cache, err := services.NewAccessCache(services.AccessCacheConfig{Events: store, Clock: viewClock, StaleGrace: bound})
	require.NoError(t, err)
	defer cache.Close()
	ap.mu.Lock()
	ap.AccessPoint = cache
	ap.mu.Unlock()
	proxy := newTestEnv(t, func(c *Config) {
		c.AccessPoint = ap
		c.Locks = locks
		c.Proxy = &fakeProxy{target: node.addr, seen: make(chan *authz.Identity, 16)}
		c.GetNode = nil
	})
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, cache.WaitSynced(waitCtx))
	require.NoError(t, locks.WaitSynced(waitCtx))

	// login dials the proxy and, through it, the node, and runs a
	// command there; banner is what the proxy said on refusal.
	login := func(user string) (banner string, err error) {
		s := node.userCA.UserSigner(t, srvtest.UserCert{User: user, Logins: []string{node.me}, Cluster: testCluster, Now: time.Now()})
		cfg := proxy.clientConfig(node.me, s)
		var mu sync.Mutex
		cfg.BannerCallback = func(msg string) error {
			mu.Lock()
			defer mu.Unlock()
			banner += msg
			return nil
		}
		pc, err := ssh.Dial("tcp", proxy.addr, cfg)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			return banner, err
		}
		defer pc.Close()
		nc, err := pc.Dial("tcp", net.JoinHostPort("node1", "22"))
		if err != nil {
			return "", err
		}
		sc, chans, reqs, err := ssh.NewClientConn(nc, node.addr, node.clientConfig(node.me, s))
		if err != nil {
			nc.Close()
			return "", err
		}
		c := ssh.NewClient(sc, chans, reqs)
		defer c.Close()
		out, _, err := run(t, c, "echo through")
		if err == nil && out != "through\n" {
			t.Errorf("output %q", out)
		}
		return "", err
	}

	_, err = login("alice")
	require.NoError(t, err, "before the outage")

	outage.Down()
	require.NoError(t, viewClock.BlockUntilContext(waitCtx, 4), "four watches broke and back off")
	require.Error(t, cache.Healthy())
	_, err = login("alice")
	require.NoError(t, err, "during the outage, from the last view")
	banner, err := login("mallory")
	require.Error(t, err)
	require.Contains(t, banner, "postern: access for user mallory is locked: incident 42", "the last known locks still deny")
	viewClock.Advance(bound - time.Second)
	require.NoError(t, viewClock.BlockUntilContext(waitCtx, 4))
	_, err = login("alice")
	require.NoError(t, err, "still within the bound")
	require.NotZero(t, cache.StaleStats().Answers)

	viewClock.Advance(2 * time.Second)
	require.NoError(t, viewClock.BlockUntilContext(waitCtx, 4))
	banner, err = login("alice")
	require.Error(t, err, "past the bound: deny by default")
	require.True(t, strings.HasPrefix(banner, "postern: "), "told why: %q", banner)
	require.Contains(t, banner, "unavailable")

	outage.Up()
	viewClock.Advance(services.DefaultMaxBackoff)
	require.Eventually(t, func() bool { return cache.Healthy() == nil && locks.Healthy() == nil }, 10*time.Second, time.Millisecond)
	_, err = login("alice")
	require.NoError(t, err, "after the backend returned")
}
