// Package memtrim gives a daemon's idle memory back to the system after a
// busy period.
//
// Why it exists: the daemon runs the garbage collector at gc_percent 400
// (config.DefaultGCPercent), chosen by measurement because it cuts a hop's
// CPU per forwarded gigabyte; the price is that the heap may grow to five
// times the live heap between collections. A proxy that has just set up a
// thousand sessions and now holds them idle allocates nothing more, so no
// collection comes to free the setup's garbage, and the runtime's own
// scavenger keeps everything under that five-fold goal resident. Measured
// on one proxy holding 1,000 idle `ssh -J` sessions: 120 KiB of PSS per
// session, against 90 KiB once the garbage is collected and released, the
// same as gc_percent 100 costs and without giving up the throughput.
//
// So the trimmer watches the allocation rate and, once the process has been
// quiet for a whole interval while a good deal of reclaimable memory is
// resident, forces one collection and returns the free pages
// (debug.FreeOSMemory). A busy process is left alone (a forced collection
// there would cost the very CPU gc_percent 400 saves), and a quiet one is
// trimmed once per busy period: after a trim nothing is reclaimable until
// new garbage appears.
package memtrim

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/promreg"
)

// Defaults: checked every 10 s; quiet means under 1 MiB/s allocated over the
// interval (an idle proxy's heartbeats, watchers and keep-alives allocate a
// few KiB/s; one `ssh -J` setup allocates ~100 KiB, so 10 setups a second
// count as busy); worth a trim is 16 MiB or a quarter of the live heap,
// whichever is more (below that a forced collection buys too little).
const (
	DefaultInterval   = 10 * time.Second
	DefaultQuietRate  = 1 << 20
	DefaultMinReclaim = 16 << 20
)

// Stats is what the policy reads from the runtime.
type Stats struct {
	// Allocated is the cumulative count of bytes allocated on the heap.
	Allocated uint64
	// Live is the heap the last collection found live.
	Live uint64
	// Reclaimable is heap memory that is resident but not live: dead
	// objects not yet collected plus free pages not yet released.
	Reclaimable uint64
}

// Config configures a Trimmer; zero fields take the defaults.
type Config struct {
	// Deps: Clock runs the ticker, Logger reports trims, Metrics gets
	// postern_memory_trims_total (component memtrim).
	observe.Deps
	Interval   time.Duration
	QuietRate  uint64 // bytes per second
	MinReclaim uint64
	// ReadStats reads the runtime (ReadRuntimeStats); Release collects
	// and releases (debug.FreeOSMemory). Tests of the policy set both.
	ReadStats func() Stats
	Release   func()
}

// Trimmer runs the policy; see the package comment.
type Trimmer struct {
	cfg   Config
	trims prometheus.Counter
}

// New checks cfg and fills in the defaults.
func New(cfg Config) (*Trimmer, error) {
	cfg.Deps.SetDefaults(observe.ComponentMemTrim)
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Interval < 0 {
		return nil, trace.BadParameter("memtrim: interval %v must be positive", cfg.Interval)
	}
	if cfg.QuietRate == 0 {
		cfg.QuietRate = DefaultQuietRate
	}
	if cfg.MinReclaim == 0 {
		cfg.MinReclaim = DefaultMinReclaim
	}
	if cfg.ReadStats == nil {
		cfg.ReadStats = ReadRuntimeStats
	}
	if cfg.Release == nil {
		cfg.Release = debug.FreeOSMemory
	}
	t := &Trimmer{cfg: cfg, trims: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "postern_memory_trims_total",
		Help: "Times the process was quiet after a busy period and returned its idle heap to the system (a forced collection and release).",
	})}
	c, err := promreg.Register(cfg.Metrics, t.trims)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	t.trims = c
	return t, nil
}

// Run applies the policy every interval until ctx is done.
func (t *Trimmer) Run(ctx context.Context) {
	ticker := t.cfg.Clock.NewTicker(t.cfg.Interval)
	defer ticker.Stop()
	last := t.cfg.ReadStats().Allocated
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
		}
		last = t.check(last)
	}
}

// check is one tick: it trims when the interval since the last one was
// quiet and enough is reclaimable, and returns the allocation count to
// measure the next interval from.
func (t *Trimmer) check(lastAllocated uint64) uint64 {
	s := t.cfg.ReadStats()
	allocated := s.Allocated - lastAllocated
	quiet := float64(allocated) < float64(t.cfg.QuietRate)*t.cfg.Interval.Seconds()
	worth := max(t.cfg.MinReclaim, s.Live/4)
	if !quiet || s.Reclaimable < worth {
		return s.Allocated
	}
	start := t.cfg.Clock.Now()
	t.cfg.Release()
	t.trims.Inc()
	t.cfg.Logger.WithFields(logrus.Fields{
		"reclaimable_mib": s.Reclaimable >> 20,
		"live_mib":        s.Live >> 20,
		"took":            t.cfg.Clock.Since(start).String(),
	}).Debug("Quiet after a busy period: collected and released the idle heap.")
	// The collection itself allocates a little; start the next interval
	// after it so that it does not count as activity.
	return t.cfg.ReadStats().Allocated
}

// runtimeSamples are the runtime/metrics the policy reads.
var runtimeSamples = []string{
	"/gc/heap/allocs:bytes",
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/free:bytes",
}

// ReadRuntimeStats reads Stats from runtime/metrics. Reclaimable is the
// heap's objects (live and not yet collected) plus its free, unreleased
// pages, less what the last collection found live.
func ReadRuntimeStats() Stats {
	samples := make([]metrics.Sample, len(runtimeSamples))
	for i, name := range runtimeSamples {
		samples[i].Name = name
	}
	metrics.Read(samples)
	v := func(i int) uint64 {
		if samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return samples[i].Value.Uint64()
	}
	s := Stats{Allocated: v(0), Live: v(1)}
	if resident := v(2) + v(3); resident > s.Live {
		s.Reclaimable = resident - s.Live
	}
	return s
}
