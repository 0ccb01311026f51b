package peer

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/limiter"
)

// TestPeerJunkFloodIsCoalesced is the flood on the peer port: 300
// connections from one address, each sending 16 junk bytes instead of a
// TLS hello. One access.denied is written at once, with the handshake's
// reason, and one summary at the window's end counting the other 299.
func TestPeerJunkFloodIsCoalesced(t *testing.T) {
	clock := clockwork.NewFakeClock()
	env := newPeerEnvWithClock(t, clock, "proxy-a", "n1")
	const n = 300
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			nc, err := net.Dial("tcp", env.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			_, _ = nc.Write([]byte("0123456789abcdef"))
			_ = nc.(*net.TCPConn).CloseWrite()
			// The server audits (or counts) before it hangs up.
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.Copy(io.Discard, nc)
		}()
	}
	wg.Wait()
	evs := env.audit.Events()
	require.Len(t, evs, 1)
	require.Equal(t, "peer", evs[0].Fields[events.FieldKind])
	require.Equal(t, 1, evs[0].Fields[events.FieldCount])
	require.Contains(t, evs[0].Fields[events.FieldReason], "peer TLS handshake failed")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(limiter.RefusalReportInterval)
	ev, err := env.audit.Wait(ctx, events.AccessDenied, func(e events.Event) bool { return e.Fields[events.FieldCount] == n-1 })
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(ev.Fields[events.FieldReason].(string), "refused 299 more times within 1m0s; the latest: peer TLS handshake failed"), ev.Fields[events.FieldReason])
	require.Len(t, env.audit.Events(), 2)
}
