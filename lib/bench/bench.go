// Package bench is the engine of `psh bench`: an open-loop load generator.
//
// Open loop: session i is scheduled at start + i/Rate, whatever happened to
// the sessions before it, and its latency counts from that scheduled time,
// not from when a worker got round to it. A closed-loop tester (start the
// next session when one finishes) slows down exactly when the server does
// and then reports the few fast samples it still takes: "coordinated
// omission" (Gil Tene). Here a slow server shows up as queueing in the
// latency, as it would for real users arriving at that rate. Concurrency
// caps the sessions in flight (descriptors are finite); a session that
// waits for a slot still counts from its schedule, so the cap hides
// nothing either.
//
// Latencies go into HDR histograms (github.com/HdrHistogram/hdrhistogram-go:
// constant memory, 3 significant digits from 1 µs to 10 minutes), one for
// the whole session and one per phase.
package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
)

// Histogram bounds, in microseconds: 1 µs to 10 minutes, 3 significant
// digits (a 0.1% error, far below run-to-run noise).
const (
	histMin     = 1
	histMax     = int64(10 * time.Minute / time.Microsecond)
	histSigFigs = 3
)

// Session is one benchmark session's work: it runs until the session is
// set up (and its command answered), recording phases as it goes, and
// returns what must be closed to end it. The engine closes it at once,
// except for held sessions.
type Session func(ctx context.Context, rec *Recorder) (io.Closer, error)

// Config configures Run.
type Config struct {
	// Rate is the number of sessions started per second. Required (> 0)
	// when Duration is set.
	Rate float64
	// Duration is how long sessions are started for. Zero with Hold > 0
	// means only the held sessions are opened and measured.
	Duration time.Duration
	// Concurrency caps the sessions in flight. Zero means
	// DefaultConcurrency.
	Concurrency int
	// Hold opens this many sessions before the rate phase and keeps them
	// open (idle) until Run returns; Sample is called before and after.
	Hold int
	// Sample, when set, reads the server's resource use (the proxy's
	// /metrics) for the hold report.
	Sample func(ctx context.Context) (Sample, error)
	// Session is the work of one session. Required.
	Session Session
	// Progress, when set, receives a one-line progress report about once
	// a second ("\r"-terminated, for a terminal's stderr).
	Progress io.Writer
	// Deps: Clock schedules sessions and times them.
	observe.Deps
}

// DefaultConcurrency bounds in-flight sessions: each costs a few
// descriptors here and at the server, and the default per-process limit
// is often 1024.
const DefaultConcurrency = 256

// CheckAndSetDefaults validates the config: a clear error for each bad
// value.
func (c *Config) CheckAndSetDefaults() error {
	switch {
	case c.Session == nil:
		return trace.BadParameter("bench: missing Session")
	case c.Duration < 0:
		return trace.BadParameter("--duration must be positive, got %v", c.Duration)
	case c.Duration == 0 && c.Hold == 0:
		return trace.BadParameter("--duration must be positive (or --hold N to only hold sessions), got 0")
	case c.Duration > 0 && !(c.Rate > 0):
		return trace.BadParameter("--rate must be a positive number of sessions per second, got %v", c.Rate)
	case c.Concurrency < 0:
		return trace.BadParameter("--concurrency must be positive, got %d", c.Concurrency)
	case c.Hold < 0:
		return trace.BadParameter("--hold must not be negative, got %d", c.Hold)
	}
	if c.Duration > 0 && c.Rate*c.Duration.Seconds() < 1 {
		return trace.BadParameter("--rate %v for --duration %v schedules no session: raise either", c.Rate, c.Duration)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	c.Deps.SetDefaults(observe.ComponentBench)
	return nil
}

// Sample is the server's resource use at one moment.
type Sample struct {
	// RSS is process_resident_memory_bytes.
	RSS int64 `json:"rss_bytes"`
	// Goroutines is go_goroutines.
	Goroutines int64 `json:"goroutines"`
}

// Stats are percentiles of one histogram, in milliseconds.
type Stats struct {
	Count int64   `json:"count"`
	Min   float64 `json:"min_ms"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p99_9_ms"`
	Max   float64 `json:"max_ms"`
}

func statsOf(h *hdrhistogram.Histogram) Stats {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	if h.TotalCount() == 0 {
		return Stats{}
	}
	return Stats{
		Count: h.TotalCount(),
		Min:   ms(h.Min()),
		Mean:  h.Mean() / 1000,
		P50:   ms(h.ValueAtQuantile(50)),
		P90:   ms(h.ValueAtQuantile(90)),
		P99:   ms(h.ValueAtQuantile(99)),
		P999:  ms(h.ValueAtQuantile(99.9)),
		Max:   ms(h.Max()),
	}
}

// HoldReport is what the held sessions cost the server.
type HoldReport struct {
	Sessions int `json:"sessions"`
	// Failed counts held sessions that could not be opened.
	Failed int    `json:"failed"`
	Before Sample `json:"before"`
	After  Sample `json:"after"`
	// Per-session figures: (after - before) / sessions opened.
	RSSPerSession        float64 `json:"rss_bytes_per_session"`
	GoroutinesPerSession float64 `json:"goroutines_per_session"`
	// Setup is the latency of opening the held sessions (closed loop:
	// they are opened as fast as Concurrency allows, so it is no
	// open-loop figure).
	Setup Stats `json:"setup"`
	// SampleError says why the server could not be sampled.
	SampleError string `json:"sample_error,omitempty"`
}

// Result is a run's report.
type Result struct {
	Rate        float64 `json:"rate"`
	DurationSec float64 `json:"duration_s"`
	Concurrency int     `json:"concurrency"`
	// Scheduled sessions; Completed + Failed == Scheduled.
	Scheduled int64 `json:"scheduled"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
	// Errors counts failures by message.
	Errors map[string]int64 `json:"errors,omitempty"`
	// Latency is from each session's scheduled start to its end.
	Latency Stats `json:"latency"`
	// Phases, in order, when the sessions record them.
	Phases []PhaseStats `json:"phases,omitempty"`
	// Hold is set when sessions were held.
	Hold *HoldReport `json:"hold,omitempty"`
	// histogram is the latency histogram, for Export.
	histogram *hdrhistogram.Histogram
}

// PhaseStats are one phase's percentiles.
type PhaseStats struct {
	Name string `json:"name"`
	Stats
}

// Export writes the latency histogram as an HdrHistogram percentile
// distribution (the .hgrm format HdrHistogram's plotter reads), values in
// milliseconds.
func (r *Result) Export(w io.Writer) error {
	if r.histogram == nil {
		return trace.BadParameter("no latencies recorded")
	}
	_, err := r.histogram.PercentilesPrint(w, 5, 1000)
	return trace.Wrap(err)
}

// Recorder collects one session's phase timings. The wait for a
// concurrency slot is its first phase ("queue"), so that the phases add up
// to the latency from the scheduled start.
type Recorder struct {
	clock clockwork.Clock
	last  time.Time
	names []string
	durs  []time.Duration
}

// Mark ends the phase named name at now: it lasted from the previous mark.
func (r *Recorder) Mark(name string) {
	now := r.clock.Now()
	r.names = append(r.names, name)
	r.durs = append(r.durs, now.Sub(r.last))
	r.last = now
}

// Now is the recorder's clock.
func (r *Recorder) Now() time.Time { return r.clock.Now() }

// collector merges the sessions' results; mu guards everything in it.
type collector struct {
	mu        sync.Mutex
	latency   *hdrhistogram.Histogram
	phases    map[string]*hdrhistogram.Histogram
	order     []string
	completed int64
	failed    int64
	errors    map[string]int64
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histSigFigs) }

func newCollector() *collector {
	return &collector{latency: newHist(), phases: map[string]*hdrhistogram.Histogram{}, errors: map[string]int64{}}
}

func record(h *hdrhistogram.Histogram, d time.Duration) {
	us := max(d.Microseconds(), histMin)
	// Out of range only above 10 minutes: clamp rather than lose it.
	_ = h.RecordValue(min(us, histMax))
}

func (c *collector) add(rec *Recorder, total time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.failed++
		c.errors[trace.UserMessage(err)]++
		return
	}
	c.completed++
	record(c.latency, total)
	for i, name := range rec.names {
		h, ok := c.phases[name]
		if !ok {
			h = newHist()
			c.phases[name] = h
			c.order = append(c.order, name)
		}
		record(h, rec.durs[i])
	}
}

// Run opens the held sessions, then runs the open-loop phase, and reports.
// Failed sessions are counted, not fatal: the run's error is only for a
// run that could not take place (bad config, ctx ended).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	res := &Result{Rate: cfg.Rate, DurationSec: cfg.Duration.Seconds(), Concurrency: cfg.Concurrency}
	if cfg.Hold > 0 {
		hold, closers, err := runHold(ctx, cfg)
		defer func() {
			for _, c := range closers {
				_ = c.Close()
			}
		}()
		if err != nil {
			return nil, trace.Wrap(err)
		}
		res.Hold = hold
	}
	if cfg.Duration == 0 {
		return res, nil
	}
	col, scheduled, err := runOpenLoop(ctx, cfg)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	res.Scheduled = scheduled
	res.Completed, res.Failed = col.completed, col.failed
	if len(col.errors) > 0 {
		res.Errors = col.errors
	}
	res.Latency = statsOf(col.latency)
	res.histogram = col.latency
	for _, name := range col.order {
		res.Phases = append(res.Phases, PhaseStats{Name: name, Stats: statsOf(col.phases[name])})
	}
	return res, nil
}

// runOpenLoop schedules Rate*Duration sessions. The scheduler never waits
// for a session: each has its own goroutine, which waits for a slot.
func runOpenLoop(ctx context.Context, cfg Config) (*collector, int64, error) {
	col := newCollector()
	n := int64(cfg.Rate * cfg.Duration.Seconds())
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	slots := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	start := cfg.Clock.Now()
	stopProgress := startProgress(cfg, col, n)
	defer stopProgress()
	var scheduled int64
	for i := int64(0); i < n; i++ {
		at := start.Add(time.Duration(i) * interval)
		if d := at.Sub(cfg.Clock.Now()); d > 0 {
			t := cfg.Clock.NewTimer(d)
			select {
			case <-t.Chan():
			case <-ctx.Done():
				t.Stop()
				wg.Wait()
				return nil, 0, trace.Wrap(ctx.Err())
			}
		}
		scheduled++
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := &Recorder{clock: cfg.Clock, last: at}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				col.add(rec, 0, trace.ConnectionProblem(ctx.Err(), "cancelled before it started"))
				return
			}
			defer func() { <-slots }()
			rec.Mark("queue")
			closer, err := cfg.Session(ctx, rec)
			total := cfg.Clock.Since(at)
			if closer != nil {
				_ = closer.Close()
			}
			col.add(rec, total, err)
		}()
	}
	wg.Wait()
	return col, scheduled, nil
}

// runHold opens cfg.Hold sessions, Concurrency at a time, and samples the
// server before and after. The closers are returned even on error.
func runHold(ctx context.Context, cfg Config) (*HoldReport, []io.Closer, error) {
	rep := &HoldReport{}
	var sampleErr error
	if cfg.Sample != nil {
		rep.Before, sampleErr = cfg.Sample(ctx)
	}
	col := newCollector()
	var mu sync.Mutex
	closers := make([]io.Closer, 0, cfg.Hold)
	slots := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	stopProgress := startProgress(cfg, col, int64(cfg.Hold))
	for i := 0; i < cfg.Hold; i++ {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			stopProgress()
			return nil, closers, trace.Wrap(ctx.Err())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			start := cfg.Clock.Now()
			rec := &Recorder{clock: cfg.Clock, last: start}
			closer, err := cfg.Session(ctx, rec)
			col.add(rec, cfg.Clock.Since(start), err)
			if closer != nil {
				mu.Lock()
				closers = append(closers, closer)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	stopProgress()
	rep.Sessions = int(col.completed)
	rep.Failed = int(col.failed)
	rep.Setup = statsOf(col.latency)
	if cfg.Sample != nil && sampleErr == nil {
		rep.After, sampleErr = cfg.Sample(ctx)
	}
	if sampleErr != nil {
		rep.SampleError = trace.UserMessage(sampleErr)
	} else if cfg.Sample != nil && rep.Sessions > 0 {
		rep.RSSPerSession = float64(rep.After.RSS-rep.Before.RSS) / float64(rep.Sessions)
		rep.GoroutinesPerSession = float64(rep.After.Goroutines-rep.Before.Goroutines) / float64(rep.Sessions)
	}
	return rep, closers, nil
}

// startProgress writes a progress line about every second until stopped.
func startProgress(cfg Config, col *collector, total int64) (stop func()) {
	if cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := cfg.Clock.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.Chan():
			}
			col.mu.Lock()
			ok, failed := col.completed, col.failed
			p50 := float64(col.latency.ValueAtQuantile(50)) / 1000
			p99 := float64(col.latency.ValueAtQuantile(99)) / 1000
			col.mu.Unlock()
			fmt.Fprintf(cfg.Progress, "\rbench: %d/%d done, %d failed, p50 %.1f ms, p99 %.1f ms ", ok+failed, total, failed, p50, p99)
		}
	}()
	return func() {
		close(done)
		<-finished
		fmt.Fprint(cfg.Progress, "\r\033[K")
	}
}

// WriteText writes the report for people.
func (r *Result) WriteText(w io.Writer) {
	if r.Hold != nil {
		h := r.Hold
		fmt.Fprintf(w, "held sessions: %d open, %d failed; setup p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
			h.Sessions, h.Failed, h.Setup.P50, h.Setup.P99, h.Setup.Max)
		if h.SampleError != "" {
			fmt.Fprintf(w, "  server not sampled: %s\n", h.SampleError)
		} else if h.After.RSS > 0 {
			fmt.Fprintf(w, "  server RSS %.1f -> %.1f MiB (%.1f KiB per session), goroutines %d -> %d (%.1f per session)\n",
				float64(h.Before.RSS)/(1<<20), float64(h.After.RSS)/(1<<20), h.RSSPerSession/1024,
				h.Before.Goroutines, h.After.Goroutines, h.GoroutinesPerSession)
		}
	}
	if r.Scheduled == 0 {
		return
	}
	fmt.Fprintf(w, "sessions: %d scheduled at %.4g/s for %gs, %d completed, %d failed (concurrency %d)\n",
		r.Scheduled, r.Rate, r.DurationSec, r.Completed, r.Failed, r.Concurrency)
	for _, msg := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(w, "  %d x %s\n", r.Errors[msg], msg)
	}
	fmt.Fprintf(w, "%-14s %8s %8s %8s %8s %8s %8s\n", "latency (ms)", "p50", "p90", "p99", "p99.9", "max", "mean")
	row := func(name string, s Stats) {
		fmt.Fprintf(w, "%-14s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", name, s.P50, s.P90, s.P99, s.P999, s.Max, s.Mean)
	}
	row("total", r.Latency)
	for _, p := range r.Phases {
		row("  "+p.Name, p.Stats)
	}
}

// Probe runs one session and closes it: a target every session would
// fail on (an unknown host, a login the roles refuse) is reported as that
// one error, before a run that would only count it thousands of times.
func Probe(ctx context.Context, s Session, clock clockwork.Clock) error {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	rec := &Recorder{clock: clock, last: clock.Now()}
	closer, err := s(ctx, rec)
	if closer != nil {
		_ = closer.Close()
	}
	return trace.Wrap(err)
}
