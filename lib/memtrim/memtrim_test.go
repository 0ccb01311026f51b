package memtrim

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRuntime is the runtime as the policy sees it: a test allocates
// (busy), and Release collects what is reclaimable.
type fakeRuntime struct {
	mu       sync.Mutex
	s        Stats
	releases int
}

func (f *fakeRuntime) alloc(n, reclaimable uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.Allocated += n
	f.s.Reclaimable += reclaimable
}

func (f *fakeRuntime) read() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *fakeRuntime) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases++
	f.s.Reclaimable = 1 << 20
	f.s.Allocated += 64 << 10 // the collection's own allocations
}

func (f *fakeRuntime) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.releases
}

func newTrimmer(t *testing.T, f *fakeRuntime, reg prometheus.Registerer) *Trimmer {
	tr, err := New(Config{
		Deps:      observe.Deps{Clock: clockwork.NewFakeClock(), Metrics: reg},
		Interval:  10 * time.Second,
		ReadStats: f.read,
		Release:   f.release,
	})
	require.NoError(t, err)
	return tr
}

// A burst of setups leaves garbage; the trim comes on the first quiet
// interval after it, once, and again only after the next burst.
func TestTrimsOnceWhenABusyPeriodGoesQuiet(t *testing.T) {
	f := &fakeRuntime{s: Stats{Live: 30 << 20}}
	reg := prometheus.NewRegistry()
	tr := newTrimmer(t, f, reg)
	last := f.read().Allocated

	f.alloc(200<<20, 90<<20) // busy: 20 MiB/s over the interval
	last = tr.check(last)
	require.Equal(t, 0, f.count(), "a busy process is left alone")

	f.alloc(200<<10, 0) // quiet: 20 KiB/s (heartbeats, keep-alives)
	last = tr.check(last)
	require.Equal(t, 1, f.count(), "the first quiet interval after the burst trims")
	require.InDelta(t, 1, testutil.ToFloat64(tr.trims), 0)

	for range 5 {
		f.alloc(200<<10, 100<<10)
		last = tr.check(last)
	}
	require.Equal(t, 1, f.count(), "quiet with nothing to reclaim: no more trims")

	f.alloc(300<<20, 120<<20)
	last = tr.check(last)
	f.alloc(10<<10, 0)
	tr.check(last)
	require.Equal(t, 2, f.count(), "the next burst is trimmed after it too")
}

// Worth a trim is max(MinReclaim, live/4): a large live heap with a little
// garbage is not collected for nothing.
func TestNoTrimWhenLittleIsReclaimable(t *testing.T) {
	f := &fakeRuntime{s: Stats{Live: 400 << 20, Reclaimable: 60 << 20}}
	tr := newTrimmer(t, f, nil)
	tr.check(f.read().Allocated)
	require.Equal(t, 0, f.count(), "60 MiB against 400 MiB live: below a quarter")

	f.s.Reclaimable = 101 << 20
	tr.check(f.read().Allocated)
	require.Equal(t, 1, f.count())

	small := &fakeRuntime{s: Stats{Live: 2 << 20, Reclaimable: 15 << 20}}
	tr = newTrimmer(t, small, nil)
	tr.check(small.read().Allocated)
	require.Equal(t, 0, small.count(), "under MinReclaim (16 MiB)")
}

// Run checks on its ticker and stops with its context.
func TestRunTicksAndStops(t *testing.T) {
	f := &fakeRuntime{s: Stats{Live: 10 << 20, Reclaimable: 64 << 20}}
	clock := clockwork.NewFakeClock()
	released := make(chan struct{}, 1)
	tr, err := New(Config{Deps: observe.Deps{Clock: clock}, Interval: time.Second, ReadStats: f.read,
		Release: func() { f.release(); released <- struct{}{} }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(time.Second)
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("no trim after a quiet tick with 64 MiB reclaimable")
	}
	cancel()
	<-done
}

func TestConfigRefusesANegativeInterval(t *testing.T) {
	_, err := New(Config{Interval: -time.Second})
	require.ErrorContains(t, err, "interval")
}

var sink [][]byte

// The real runtime: garbage left by a burst (the collector held off, as
// gc_percent 400 holds it off in an idle daemon) shows up as reclaimable,
// and the real release takes it back.
func TestReleasesRealGarbage(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	runtime.GC()
	base := ReadRuntimeStats()
	for range 64 {
		sink = append(sink, make([]byte, 1<<20))
	}
	sink = nil
	before := ReadRuntimeStats()
	require.GreaterOrEqual(t, before.Reclaimable, base.Reclaimable+60<<20, "64 MiB of garbage is reclaimable")
	tr, err := New(Config{Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	tr.check(before.Allocated) // nothing allocated since: quiet
	after := ReadRuntimeStats()
	require.InDelta(t, 1, testutil.ToFloat64(tr.trims), 0)
	require.Less(t, after.Reclaimable, uint64(DefaultMinReclaim), "released: %d MiB still reclaimable", after.Reclaimable>>20)
}
