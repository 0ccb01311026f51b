package srv

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/limiter"
)

// TestCloseWaitsForRefusedConns: a connection refused by a cap still has
// its global requests answered (refused) while it waits for the channel
// that carries the reason, and Close returns only after every goroutine
// the refusal started has ended (whoever starts a goroutine ends it). The check runs
// the moment Close returns, without goleak's retries: a goroutine that
// ends "soon after" is one nobody owns.
func TestCloseWaitsForRefusedConns(t *testing.T) {
	lim, err := limiter.NewConnectionLimiter(limiter.Config{Name: "test", MaxConnectionsPerUser: 1})
	require.NoError(t, err)
	e := newTestEnv(t, func(c *Config) { c.Limiter = lim })
	e.dial()
	const refused = 8
	for range refused {
		c, err := e.dialAs(e.me, e.signer(e.me))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		ok, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
		require.NoError(t, err)
		require.False(t, ok, "a refused connection answers global requests with a refusal")
	}
	require.Len(t, goroutinesCreatedBy("github.com/postern-dev/postern/lib/srv.(*Server).refuseConn", false), refused)
	require.NoError(t, e.srv.Close())
	require.Empty(t, goroutinesCreatedBy("github.com/postern-dev/postern/lib/srv.(*Server).refuseConn", true),
		"goroutines of refused connections outlived Server.Close")
}

// goroutinesCreatedBy returns the stacks of the goroutines that fn
// started. With blockedOnly, only goroutines blocked in something (a
// channel, a lock, I/O) count: one that is runnable has passed the signal
// its owner waits for and is only returning.
func goroutinesCreatedBy(fn string, blockedOnly bool) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, _, _ := bytes.Cut(g, []byte("\n"))
		if blockedOnly && (bytes.Contains(header, []byte("[runnable")) || bytes.Contains(header, []byte("[running"))) {
			continue
		}
		if bytes.Contains(g, []byte("created by "+fn+" in goroutine")) {
			out = append(out, string(g))
		}
	}
	return out
}
