package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/stretchr/testify/require"
)

// denialLog records reports and lets a test wait for a number of them.
type denialLog struct {
	mu   sync.Mutex
	got  []Denial
	more chan struct{}
}

func newDenialLog() *denialLog { return &denialLog{more: make(chan struct{}, 1)} }

func (l *denialLog) report(d Denial) {
	l.mu.Lock()
	l.got = append(l.got, d)
	l.mu.Unlock()
	select {
	case l.more <- struct{}{}:
	default:
	}
}

func (l *denialLog) all() []Denial {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Denial(nil), l.got...)
}

// waitLen waits until n reports are in (summaries come from the fake
// clock's timer goroutine) and returns them.
func (l *denialLog) waitLen(t *testing.T, n int) []Denial {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if got := l.all(); len(got) >= n {
			require.Len(t, got, n)
			return got
		}
		select {
		case <-l.more:
		case <-deadline:
			t.Fatalf("want %d reports, got %v", n, l.all())
		}
	}
}

func newTestDenials(t *testing.T, maxKeys int) (*Denials, *denialLog, *clockwork.FakeClock) {
	t.Helper()
	clock := clockwork.NewFakeClock()
	log := newDenialLog()
	d, err := NewDenials(DenialsConfig{Report: log.report, Window: time.Minute, MaxKeys: maxKeys, Deps: observe.Deps{Clock: clock}})
	require.NoError(t, err)
	t.Cleanup(d.Close)
	return d, log, clock
}

// advanceWindow moves the fake clock past the window once its timer waits.
func advanceWindow(t *testing.T, clock *clockwork.FakeClock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(time.Minute)
}

// TestDenialsFloodFromOneSource is the flood: 3000 failed handshakes from
// one address in a window cost one report at once (with its reason) and
// one summary at the window's end counting the other 2999; a flood that
// goes on costs one summary per window, and once it stops for a window
// the address is forgotten.
func TestDenialsFloodFromOneSource(t *testing.T) {
	d, log, clock := newTestDenials(t, 0)
	for i := range 3000 {
		d.Deny(fmt.Sprintf("192.0.2.7:%d", 10000+i), "handshake", fmt.Sprintf("handshake failed: conn %d", i))
	}
	require.Equal(t, 2999, d.Pending())
	got := log.waitLen(t, 1)
	require.Equal(t, Denial{Addr: "192.0.2.7:10000", Key: "192.0.2.7", Kind: "handshake", Reason: "handshake failed: conn 0", Count: 1}, got[0])

	advanceWindow(t, clock)
	got = log.waitLen(t, 2)
	require.Equal(t, Denial{Addr: "192.0.2.7:12999", Key: "192.0.2.7", Kind: "handshake", Reason: "handshake failed: conn 2999", Count: 2999, Summary: true, Window: time.Minute}, got[1])
	require.Equal(t, "refused 2999 more times within 1m0s; the latest: handshake failed: conn 2999", got[1].Text())
	require.Equal(t, "handshake failed: conn 0", got[0].Text())

	// Still flooding in the next window: counted, not reported at once.
	for range 500 {
		d.Deny("192.0.2.7:1", "handshake", "again")
	}
	require.Len(t, log.all(), 2)
	advanceWindow(t, clock)
	got = log.waitLen(t, 3)
	require.Equal(t, 500, got[2].Count)
	require.True(t, got[2].Summary)

	// A quiet window: nothing to say, and the address is forgotten.
	advanceWindow(t, clock)
	require.Eventually(t, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return !d.open
	}, 10*time.Second, time.Millisecond, "the quiet window ended without a new one")
	require.Len(t, log.all(), 3)
	d.Deny("192.0.2.7:2", "handshake", "back")
	got = log.waitLen(t, 4)
	require.Equal(t, Denial{Addr: "192.0.2.7:2", Key: "192.0.2.7", Kind: "handshake", Reason: "back", Count: 1}, got[3])
}

// TestDenialsKindsReportedAtOnce: different refusals from one address
// (a leaf trying each wrong certificate in turn) are each reported at
// once with their own reason; only repeats wait for the summary.
func TestDenialsKindsReportedAtOnce(t *testing.T) {
	d, log, clock := newTestDenials(t, 0)
	for i := range 5 {
		reason := fmt.Sprintf("refusal %d", i)
		d.Deny("192.0.2.7:1", reason, reason)
		got := log.waitLen(t, i+1)
		require.Equal(t, reason, got[i].Reason)
		require.Equal(t, 1, got[i].Count)
	}
	d.Deny("192.0.2.7:1", "refusal 3", "refusal 3")
	d.Deny("192.0.2.7:1", "refusal 3", "refusal 3")
	// Another address: its first is reported at once.
	d.Deny("198.51.100.1:1", "refusal 3", "refusal 3")
	got := log.waitLen(t, 6)
	require.Equal(t, "198.51.100.1", got[5].Key)
	advanceWindow(t, clock)
	got = log.waitLen(t, 7)
	require.Equal(t, Denial{Addr: "192.0.2.7:1", Key: "192.0.2.7", Kind: "refusal 3", Reason: "refusal 3", Count: 2, Summary: true, Window: time.Minute}, got[6])
}

// TestDenialsGlobalCap: a flood from many addresses, or of made-up kinds,
// costs at most MaxKeys reports at once and one summary of the rest.
func TestDenialsGlobalCap(t *testing.T) {
	const maxKeys = 8
	d, log, clock := newTestDenials(t, maxKeys)
	for i := range 1000 {
		d.Deny(fmt.Sprintf("10.0.%d.%d:22", i/250, i%250), "handshake", "junk")
		d.Deny("192.0.2.7:1", fmt.Sprintf("made-up kind %d", i), "refused")
	}
	got := log.waitLen(t, maxKeys)
	for _, r := range got {
		require.Equal(t, 1, r.Count)
	}
	advanceWindow(t, clock)
	got = log.waitLen(t, maxKeys+1)
	last := got[maxKeys]
	require.True(t, last.Summary)
	require.Empty(t, last.Key)
	require.Empty(t, last.Kind)
	require.Equal(t, 2000-maxKeys, last.Count)
	require.Equal(t, fmt.Sprintf("%d more refusals within 1m0s, beyond the kinds and sources audited one by one; the latest: refused", 2000-maxKeys), last.Text())
}

// TestDenialsCloseWritesSummaries: Close writes what the window counted,
// and reports later refusals one by one.
func TestDenialsCloseWritesSummaries(t *testing.T) {
	d, log, _ := newTestDenials(t, 0)
	for range 3 {
		d.Deny("192.0.2.7:1", "handshake", "junk")
	}
	d.Close()
	got := log.waitLen(t, 2)
	require.Equal(t, 2, got[1].Count)
	d.Deny("192.0.2.7:1", "handshake", "junk")
	d.Deny("192.0.2.7:1", "handshake", "junk")
	log.waitLen(t, 4)
}

func TestDenialsConfig(t *testing.T) {
	_, err := NewDenials(DenialsConfig{})
	require.ErrorContains(t, err, "Report")
	_, err = NewDenials(DenialsConfig{Report: func(Denial) {}, Window: -time.Second})
	require.ErrorContains(t, err, "negative denial window")
	_, err = NewDenials(DenialsConfig{Report: func(Denial) {}, MaxKeys: -1})
	require.ErrorContains(t, err, "negative denial MaxKeys")
}
