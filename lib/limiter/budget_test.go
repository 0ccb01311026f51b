package limiter

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// readEOF reports whether the server closed c (a refusal) rather than
// holding it.
func readEOF(t *testing.T, c net.Conn) bool {
	t.Helper()
	_, err := c.Read(make([]byte, 1))
	return err != nil
}

// TestBudgetSharedByListeners: two listeners on one budget of 5
// descriptors, one costing 2 per connection: what one holds the other
// cannot take, the refusal names the budget, and a close gives it back.
func TestBudgetSharedByListeners(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := NewBudget(BudgetConfig{Descriptors: 5, Reason: "RLIMIT_NOFILE 261 less 256 kept", Metrics: reg})
	require.NoError(t, err)
	sshLim, _ := newTestLimiter(t, Config{Name: "proxy_ssh", Budget: b, DescriptorsPerConn: 2})
	tunLim, tunReg := newTestLimiter(t, Config{Name: "tunnel", Budget: b})

	r1, err := sshLim.AcquireIP(tcpAddr("192.0.2.1", 1))
	require.NoError(t, err)
	r2, err := sshLim.AcquireIP(tcpAddr("192.0.2.2", 1))
	require.NoError(t, err)
	require.Equal(t, 4, b.Used())
	r3, err := tunLim.AcquireIP(tcpAddr("192.0.2.3", 1))
	require.NoError(t, err)
	_, err = tunLim.AcquireIP(tcpAddr("192.0.2.3", 2))
	require.Error(t, err)
	require.Contains(t, err.Error(), "too many connections to tunnel: the file descriptor budget of 5 is spent (RLIMIT_NOFILE 261 less 256 kept; each connection here costs 1)")
	r3()
	_, err = sshLim.AcquireIP(tcpAddr("192.0.2.4", 1))
	require.Error(t, err, "one descriptor left, an SSH session needs two")
	require.Contains(t, err.Error(), "each connection here costs 2: 2 sessions")
	require.Equal(t, 4, b.Used(), "a refusal holds nothing")
	r1()
	r1()
	require.Equal(t, 2, b.Used(), "a release gives its cost back once")
	r2()
	require.Zero(t, b.Used())
	require.Equal(t, 1.0, metricValue(t, tunReg, "postern_limiter_refusals_total", map[string]string{"listener": "tunnel", "cap": CapDescriptors}))
	require.Equal(t, 5.0, metricValue(t, reg, "postern_limiter_descriptor_budget", nil))

	_, err = NewBudget(BudgetConfig{})
	require.Error(t, err)
}

// TestWrapListenerHandshakes: on a listener counting handshakes, one
// address holds at most MaxHandshakesPerIP connections that have not
// authenticated (the next is closed at once), a HandshakeDone connection
// (also through a *tls.Conn) leaves the handshake count while it stays
// open, and gives back its rate token.
func TestWrapListenerHandshakes(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lim, reg := newTestLimiter(t, Config{Name: "tunnel", MaxConnectionsPerIP: -1, MaxHandshakesPerIP: 3})
	rl, err := NewRateLimiter(RateConfig{Rate: 1, Burst: 4, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	refusals := make(chan Refusal, 8)
	ln := WrapListener(raw, lim, ListenerOptions{Rate: rl, Handshakes: true, OnRefuse: func(r Refusal) { refusals <- r }})
	conns := acceptLoop(t, ln)

	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	var served []net.Conn
	for range 3 {
		dial()
		served = append(served, <-conns)
	}
	require.Equal(t, 3, lim.Count(CapHandshakes, "127.0.0.1"))
	require.True(t, readEOF(t, dial()), "a fourth idle connection from the address is closed at once")
	require.Equal(t, 1.0, metricValue(t, reg, "postern_limiter_refusals_total", map[string]string{"listener": "tunnel", "cap": CapHandshakes}))
	require.Equal(t, CapHandshakes, (<-refusals).Cap)

	// Authenticated: out of the handshake count, still open and counted.
	HandshakeDone(served[0])
	HandshakeDone(tls.Server(served[1], &tls.Config{}))
	HandshakeDone(served[1])
	require.Equal(t, 1, lim.Count(CapHandshakes, "127.0.0.1"))
	require.Equal(t, 3, lim.Count(CapConnections, ""))
	// The four tokens were spent by four accepts (the refused one too);
	// two came back with the two handshakes.
	for range 2 {
		dial()
		served = append(served, <-conns)
	}
	require.Equal(t, 3, lim.Count(CapHandshakes, ""))
	require.True(t, readEOF(t, dial()), "rate spent: refused")
	require.Equal(t, CapRate, (<-refusals).Cap)
	for _, c := range served {
		c.Close()
	}
	require.Zero(t, lim.Count(CapHandshakes, ""))
	require.Zero(t, lim.Count(CapConnections, ""))
}
