package srv

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/limiter"
)

// TestCapsAreVisible: a refused connection or channel tells the client why
// (a channel-open failure with the limiter's reason), never a silent hang,
// and a released slot can be taken again.
func TestCapsAreVisible(t *testing.T) {
	lim, err := limiter.NewConnectionLimiter(limiter.Config{Name: "test", MaxConnectionsPerUser: 1, MaxSessionsPerUser: 1})
	require.NoError(t, err)
	e := newTestEnv(t, func(c *Config) { c.Limiter = lim })

	first := e.dial()
	s1, err := first.NewSession()
	require.NoError(t, err)

	// A second channel of the same user: refused with the reason.
	_, err = first.NewSession()
	require.ErrorContains(t, err, "resource shortage")
	require.ErrorContains(t, err, `too many sessions for user \"alice\"`)

	// A second connection of the same user: authenticated, then refused on
	// its first channel with the reason.
	second, err := e.dialAs(e.me, e.signer(e.me))
	require.NoError(t, err)
	_, err = second.NewSession()
	require.ErrorContains(t, err, `too many connections for user \"alice\"`)
	second.Close()

	// Releasing the channel frees the slot.
	require.NoError(t, s1.Close())
	require.Eventually(t, func() bool { return lim.Count(limiter.CapSessions, "alice") == 0 }, 5e9, 1e7)
	s2, err := first.NewSession()
	require.NoError(t, err)
	out, err := s2.Output("echo ok")
	require.NoError(t, err)
	require.Equal(t, "ok\n", string(out))
}

// TestForwardCap: one forwarded port holds at most its cap of connections;
// the next is refused with the reason, and a closed one frees its slot.
func TestForwardCap(t *testing.T) {
	lim, err := limiter.NewConnectionLimiter(limiter.Config{Name: "test", MaxConnectionsPerForward: 1})
	require.NoError(t, err)
	e := newTestEnv(t, func(c *Config) { c.Limiter = lim })
	c := e.dial()
	target := echoServer(t)
	first, err := c.Dial("tcp", target)
	require.NoError(t, err)
	_, err = c.Dial("tcp", target)
	require.ErrorContains(t, err, "resource shortage")
	require.NoError(t, first.Close())
	require.Eventually(t, func() bool {
		conn, err := c.Dial("tcp", target)
		if err != nil {
			return false
		}
		echoRoundTrip(t, conn, "again")
		conn.Close()
		return true
	}, 5e9, 1e7)
}
