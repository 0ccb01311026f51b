package limiter

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/observe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func tcpAddr(ip string, port int) net.Addr {
	return &net.TCPAddr{IP: net.ParseIP(ip), Port: port}
}

// metricValue reads one counter or gauge series from reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func newTestLimiter(t *testing.T, cfg Config) (*ConnectionLimiter, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	if cfg.Logger == nil {
		l, _ := test.NewNullLogger()
		cfg.Logger = l
	}
	lim, err := NewConnectionLimiter(cfg)
	require.NoError(t, err)
	return lim, reg
}

func TestDefaults(t *testing.T) {
	cfg := Config{MaxSessionsPerUser: -1}
	require.NoError(t, cfg.CheckAndSetDefaults())
	require.Equal(t, DefaultMaxConnections, cfg.MaxConnections)
	require.Equal(t, DefaultMaxConnectionsPerIP, cfg.MaxConnectionsPerIP)
	require.Equal(t, DefaultMaxConnectionsPerUser, cfg.MaxConnectionsPerUser)
	require.Equal(t, DefaultMaxConnectionsPerForward, cfg.MaxConnectionsPerForward)
	require.Equal(t, -1, cfg.MaxSessionsPerUser, "negative means no cap and is kept")
}

func TestPerIPCap(t *testing.T) {
	lim, reg := newTestLimiter(t, Config{Name: "proxy_ssh", MaxConnectionsPerIP: 2})
	r1, err := lim.AcquireIP(tcpAddr("192.0.2.7", 1000))
	require.NoError(t, err)
	r2, err := lim.AcquireIP(tcpAddr("192.0.2.7", 1001))
	require.NoError(t, err)
	_, err = lim.AcquireIP(tcpAddr("192.0.2.7", 1002))
	require.True(t, trace.IsLimitExceeded(err), "%v", err)
	require.EqualError(t, err, "too many connections from 192.0.2.7: limit 2")
	// Another address is not affected.
	r3, err := lim.AcquireIP(tcpAddr("192.0.2.8", 1000))
	require.NoError(t, err)
	require.Equal(t, 3, lim.Count(CapConnections, ""))
	require.Equal(t, 2, lim.Count(CapIP, "192.0.2.7:1"))

	require.Equal(t, 1.0, metricValue(t, reg, "postern_limiter_refusals_total", map[string]string{"listener": "proxy_ssh", "cap": CapIP}))
	require.Equal(t, 3.0, metricValue(t, reg, "postern_limiter_active", map[string]string{"listener": "proxy_ssh", "kind": CapConnections}))

	// Releasing twice frees one slot only.
	r1()
	r1()
	require.Equal(t, 1, lim.Count(CapIP, "192.0.2.7"))
	r4, err := lim.AcquireIP(tcpAddr("192.0.2.7", 1003))
	require.NoError(t, err)
	_, err = lim.AcquireIP(tcpAddr("192.0.2.7", 1004))
	require.Error(t, err)
	r2()
	r3()
	r4()
	require.Equal(t, 0, lim.Count(CapConnections, ""))
	require.Empty(t, lim.ips, "entries at zero are removed")
	require.Equal(t, 0.0, metricValue(t, reg, "postern_limiter_active", map[string]string{"listener": "proxy_ssh", "kind": CapConnections}))
}

func TestIPv6CountedPer64(t *testing.T) {
	lim, _ := newTestLimiter(t, Config{MaxConnectionsPerIP: 1})
	r, err := lim.AcquireIP(tcpAddr("2001:db8:1:2::1", 22))
	require.NoError(t, err)
	defer r()
	_, err = lim.AcquireIP(tcpAddr("2001:db8:1:2:ffff::9", 22))
	require.EqualError(t, err, "too many connections from 2001:db8:1:2::/64: limit 1")
	r2, err := lim.AcquireIP(tcpAddr("2001:db8:1:3::1", 22))
	require.NoError(t, err, "another /64 is another key")
	r2()
	// IPv4-mapped IPv6 is the IPv4 address.
	r3, err := lim.AcquireIP(tcpAddr("::ffff:192.0.2.1", 22))
	require.NoError(t, err)
	defer r3()
	_, err = lim.AcquireIP(tcpAddr("192.0.2.1", 22))
	require.EqualError(t, err, "too many connections from 192.0.2.1: limit 1")
}

func TestTotalCapAndNonIPAddrs(t *testing.T) {
	lim, reg := newTestLimiter(t, Config{Name: "node", MaxConnections: 2, MaxConnectionsPerIP: 1})
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	// A pipe has no remote host: only the total applies.
	r1, err := lim.AcquireIP(a.RemoteAddr())
	require.NoError(t, err)
	r2, err := lim.AcquireIP(b.RemoteAddr())
	require.NoError(t, err)
	_, err = lim.AcquireIP(tcpAddr("192.0.2.1", 1))
	require.EqualError(t, err, "too many connections to node: limit 2")
	require.Equal(t, 1.0, metricValue(t, reg, "postern_limiter_refusals_total", map[string]string{"cap": CapConnections}))
	r1()
	r2()
}

func TestUnlimited(t *testing.T) {
	lim, _ := newTestLimiter(t, Config{MaxConnections: -1, MaxConnectionsPerIP: -1, MaxConnectionsPerUser: -1})
	var releases []func()
	for i := 0; i < DefaultMaxConnectionsPerIP+10; i++ {
		r, err := lim.AcquireIP(tcpAddr("192.0.2.1", i))
		require.NoError(t, err)
		releases = append(releases, r)
		r, err = lim.AcquireUser("alice")
		require.NoError(t, err)
		releases = append(releases, r)
	}
	for _, r := range releases {
		r()
	}
}

func TestUserSessionForwardCaps(t *testing.T) {
	lim, reg := newTestLimiter(t, Config{Name: "proxy_ssh", MaxConnectionsPerUser: 1, MaxSessionsPerUser: 2, MaxConnectionsPerForward: 1})
	ru, err := lim.AcquireUser("alice")
	require.NoError(t, err)
	_, err = lim.AcquireUser("alice")
	require.True(t, trace.IsLimitExceeded(err))
	require.EqualError(t, err, `too many connections for user "alice": limit 1`)
	rb, err := lim.AcquireUser("bob")
	require.NoError(t, err)

	s1, err := lim.AcquireSession("alice")
	require.NoError(t, err)
	s2, err := lim.AcquireSession("alice")
	require.NoError(t, err)
	_, err = lim.AcquireSession("alice")
	require.EqualError(t, err, `too many sessions for user "alice": limit 2`)

	f1, err := lim.AcquireForward("c1/-R/127.0.0.1:8080")
	require.NoError(t, err)
	_, err = lim.AcquireForward("c1/-R/127.0.0.1:8080")
	require.EqualError(t, err, "too many connections on forwarded port c1/-R/127.0.0.1:8080: limit 1")
	f2, err := lim.AcquireForward("c1/-L/db:5432")
	require.NoError(t, err)

	for c, want := range map[string]float64{CapUser: 1, CapSessions: 1, CapForward: 1, CapIP: 0} {
		require.Equal(t, want, metricValue(t, reg, "postern_limiter_refusals_total", map[string]string{"cap": c}), c)
	}
	require.Equal(t, 2.0, metricValue(t, reg, "postern_limiter_active", map[string]string{"kind": CapSessions}))
	for _, r := range []func(){ru, rb, s1, s2, f1, f2} {
		r()
	}
	require.Empty(t, lim.users)
	require.Empty(t, lim.sessions)
	require.Empty(t, lim.forwards)
	_, err = lim.AcquireUser("alice")
	require.NoError(t, err)
}

// TestSharedRegistry: the limiters of several listeners share one registry.
func TestSharedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, _ := test.NewNullLogger()
	a, err := NewConnectionLimiter(Config{Name: "proxy_ssh", MaxConnectionsPerUser: 1, Deps: observe.Deps{Metrics: reg, Logger: l}})
	require.NoError(t, err)
	b, err := NewConnectionLimiter(Config{Name: "web", MaxConnectionsPerUser: 1, Deps: observe.Deps{Metrics: reg, Logger: l}})
	require.NoError(t, err)
	for _, lim := range []*ConnectionLimiter{a, b, b} {
		r, err := lim.AcquireUser("u")
		if err == nil {
			defer r()
		}
		_, err = lim.AcquireUser("u")
		require.Error(t, err)
	}
	require.Equal(t, 1.0, metricValue(t, reg, "postern_limiter_refusals_total", map[string]string{"listener": "proxy_ssh"}))
	require.Equal(t, 3.0, metricValue(t, reg, "postern_limiter_refusals_total", map[string]string{"listener": "web"}))
}

// TestRefusalWarnThrottled: one Warn per cap per interval, Debug always.
func TestRefusalWarnThrottled(t *testing.T) {
	logger, hook := test.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	clock := clockwork.NewFakeClock()
	lim, _ := newTestLimiter(t, Config{MaxConnectionsPerUser: 1, Deps: observe.Deps{Clock: clock, Logger: logger}})
	r, err := lim.AcquireUser("alice")
	require.NoError(t, err)
	defer r()
	warns := func() (n int, last *logrus.Entry) {
		for _, e := range hook.AllEntries() {
			if e.Level == logrus.WarnLevel {
				n++
				last = e
			}
		}
		return n, last
	}
	for i := 0; i < 5; i++ {
		_, err := lim.AcquireUser("alice")
		require.Error(t, err)
	}
	n, _ := warns()
	require.Equal(t, 1, n)
	clock.Advance(refusalLogInterval)
	_, err = lim.AcquireUser("alice")
	require.Error(t, err)
	n, last := warns()
	require.Equal(t, 2, n)
	require.Equal(t, 4, last.Data["refused_since_last_warning"])
	require.Contains(t, last.Message, `too many connections for user "alice": limit 1`)
}

// TestConcurrentNeverExceeds: under contention the cap is never exceeded
// and every slot comes back.
func TestConcurrentNeverExceeds(t *testing.T) {
	const limit = 5
	lim, _ := newTestLimiter(t, Config{MaxConnectionsPerIP: limit})
	var held, maxHeld, refused atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				r, err := lim.AcquireIP(tcpAddr("192.0.2.1", g*1000+i))
				if err != nil {
					refused.Add(1)
					continue
				}
				n := held.Add(1)
				for {
					m := maxHeld.Load()
					if n <= m || maxHeld.CompareAndSwap(m, n) {
						break
					}
				}
				held.Add(-1)
				r()
			}
		}(g)
	}
	wg.Wait()
	require.LessOrEqual(t, maxHeld.Load(), int64(limit))
	require.Equal(t, 0, lim.Count(CapConnections, ""))
	require.Empty(t, lim.ips)
	t.Logf("refused %d of %d", refused.Load(), 16*200)
}

func TestRateLimiter(t *testing.T) {
	clock := clockwork.NewFakeClock()
	reg := prometheus.NewRegistry()
	rl, err := NewRateLimiter(RateConfig{Name: "proxy_ssh", Rate: 2, Burst: 3, Deps: observe.Deps{Clock: clock, Metrics: reg}})
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		require.NoError(t, rl.Allow("192.0.2.1"))
	}
	err = rl.Allow("192.0.2.1")
	require.True(t, trace.IsLimitExceeded(err))
	require.EqualError(t, err, "too many new connections from 192.0.2.1: limit 2 per second; try again in 500ms")
	require.NoError(t, rl.Allow("192.0.2.2"), "keys are independent")
	clock.Advance(500 * time.Millisecond)
	require.NoError(t, rl.Allow("192.0.2.1"))
	require.Error(t, rl.Allow("192.0.2.1"))
	// Refill never exceeds the burst.
	clock.Advance(time.Hour)
	for i := 0; i < 3; i++ {
		require.NoError(t, rl.Allow("192.0.2.1"))
	}
	require.Error(t, rl.Allow("192.0.2.1"))
	require.Equal(t, 3.0, metricValue(t, reg, "postern_limiter_refusals_total", map[string]string{"cap": CapRate}))

	require.NoError(t, rl.AllowAddr(tcpAddr("2001:db8::1", 1)))
	require.NoError(t, rl.AllowAddr(&net.UnixAddr{Name: "@x", Net: "unix"}))
}

func TestRateLimiterBoundedKeys(t *testing.T) {
	clock := clockwork.NewFakeClock()
	rl, err := NewRateLimiter(RateConfig{Rate: 1, Burst: 1, MaxKeys: 10, Deps: observe.Deps{Clock: clock}})
	require.NoError(t, err)
	for i := 0; i < 10; i++ {
		require.NoError(t, rl.Allow(fmt.Sprint(i)))
	}
	// Full, nothing refilled: a new key is allowed untracked.
	require.NoError(t, rl.Allow("new"))
	require.NoError(t, rl.Allow("new"))
	require.Equal(t, 10, rl.Len())
	// After a refill the full buckets are swept and the key is tracked.
	clock.Advance(time.Second)
	require.NoError(t, rl.Allow("new"))
	require.Equal(t, 1, rl.Len())
	require.Error(t, rl.Allow("new"))

	_, err = NewRateLimiter(RateConfig{Rate: -1})
	require.True(t, trace.IsBadParameter(err))
}
