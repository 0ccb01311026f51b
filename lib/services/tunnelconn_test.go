package services

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// TestTunnelLocatorIndex drives the locator's index as its watcher does
// (Put, Delete, Reset): one entry per (node, proxy), a renewal replaces,
// a delete removes only its proxy, expired and excluded leases are not
// offered, and interned proxy strings stay correct across nodes.
func TestTunnelLocatorIndex(t *testing.T) {
	clock := clockwork.NewFakeClock()
	l := &TunnelLocator{cfg: TunnelLocatorConfig{Clock: clock}, byNode: map[string][]TunnelConnection{},
		proxyStrings: map[string]string{}, waiters: map[string]chan struct{}{}}
	c := (*tunnelCollector)(l)
	now := clock.Now()
	lease := func(node, proxy string, seen time.Duration) TunnelConnection {
		return TunnelConnection{NodeUUID: node, ProxyUUID: proxy, PeerAddr: proxy + ":3021",
			LastSeen: now.Add(seen), Expires: now.Add(seen + DefaultTunnelConnectionTTL)}
	}
	proxies := func(tcs []TunnelConnection) []string {
		var out []string
		for _, tc := range tcs {
			require.Equal(t, tc.ProxyUUID+":3021", tc.PeerAddr)
			out = append(out, tc.ProxyUUID)
		}
		return out
	}

	located := l.Located("n1")
	c.Put(lease("n1", "pa", 0))
	select {
	case <-located:
	default:
		t.Fatal("a lease for n1 wakes its waiters")
	}
	c.Put(lease("n1", "pb", time.Second))
	c.Put(lease("n2", "pa", 0))
	require.Equal(t, []string{"pb", "pa"}, proxies(l.Holders("n1", "")), "newest first")
	require.Equal(t, []string{"pa"}, proxies(l.Holders("n1", "pb")), "the excluded proxy is left out")

	// A renewal replaces pa's lease (it is now the newest), no duplicate.
	c.Put(lease("n1", "pa", 2*time.Second))
	require.Equal(t, []string{"pa", "pb"}, proxies(l.Holders("n1", "")))
	require.Len(t, l.byNode["n1"], 2)

	// Expiry: pb's lease ended first.
	clock.Advance(DefaultTunnelConnectionTTL + time.Second)
	require.Equal(t, []string{"pa"}, proxies(l.Holders("n1", "")))

	// A delete removes only its proxy, the last one removes the node.
	c.Delete(TunnelConnectionKey("n1", "pa"))
	require.Equal(t, []string{"pb"}, proxies(l.byNode["n1"]))
	c.Delete(TunnelConnectionKey("n1", "pb"))
	_, ok := l.byNode["n1"]
	require.False(t, ok)
	c.Delete(TunnelConnectionKey("n1", "pb")) // unknown: ignored
	c.Delete("garbage")

	c.Reset([]TunnelConnection{lease("n3", "pc", 0)})
	require.Empty(t, l.byNode["n2"])
	require.Equal(t, []string{"pc"}, proxies(l.byNode["n3"]))
	require.Equal(t, map[string]string{"pc": "pc", "pc:3021": "pc:3021"}, l.proxyStrings, "Reset forgets proxies gone")
}
