package reversetunnel

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

// junkFlood is the attack: n connections to addr, each sending 16 junk
// bytes and closing its write side, waited on until the server hangs up.
func junkFlood(t *testing.T, addr string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			nc, err := net.Dial("tcp", addr)
			if !noErr(t, err) {
				return
			}
			defer nc.Close()
			_, _ = nc.Write([]byte("0123456789abcdef"))
			_ = nc.(*net.TCPConn).CloseWrite()
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.Copy(io.Discard, nc)
		}()
	}
	wg.Wait()
}

func noErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// TestTunnelJunkFloodIsCoalesced: 300 connections of junk from one
// address write one access.denied at once, with the handshake's reason,
// and one summary at the window's end counting the other 299 — not 300
// events.
func TestTunnelJunkFloodIsCoalesced(t *testing.T) {
	clock := clockwork.NewFakeClock()
	f := newFixture(t, clock)
	const n = 300
	junkFlood(t, f.addr, n)
	// x/crypto closes a connection whose handshake failed before the
	// server sees the error: the last refusals may be counted after the
	// clients saw their connections end.
	require.Eventually(t, func() bool { return f.srv.denials.Pending() == n-1 }, 10*time.Second, 5*time.Millisecond,
		"all but the first refusal counted for the summary")
	evs := f.audit.Events()
	require.Len(t, evs, 1)
	require.Equal(t, events.AccessDenied, evs[0].Type)
	require.Equal(t, "tunnel", evs[0].Fields[events.FieldKind])
	require.Equal(t, 1, evs[0].Fields[events.FieldCount])
	require.Contains(t, evs[0].Fields[events.FieldReason], "tunnel handshake failed")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(limiter.RefusalReportInterval)
	ev, err := f.audit.Wait(ctx, events.AccessDenied, func(e events.Event) bool { return e.Fields[events.FieldCount] == n-1 })
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(ev.Fields[events.FieldReason].(string), "refused 299 more times within 1m0s; the latest: tunnel handshake failed"), ev.Fields[events.FieldReason])
	require.Equal(t, "tunnel", ev.Fields[events.FieldKind])
	require.Len(t, f.audit.Events(), 2)
}
