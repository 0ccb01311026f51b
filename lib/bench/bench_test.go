package bench

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/client"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOpenLoopCountsFromSchedule: with one slot and sessions that take
// 300 ms at 10/s, a closed-loop tester would report 300 ms every time;
// open loop, session i waits for i-1 sessions before it and counts from
// its schedule, so the latencies grow (coordinated omission avoided).
func TestOpenLoopCountsFromSchedule(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var mu sync.Mutex
	running := 0
	session := func(ctx context.Context, rec *Recorder) (io.Closer, error) {
		mu.Lock()
		running++
		require.Equal(t, 1, running, "concurrency 1")
		mu.Unlock()
		// The session's work is the time the test advances the clock.
		clock.Sleep(300 * time.Millisecond)
		rec.Mark("work")
		mu.Lock()
		running--
		mu.Unlock()
		return nil, nil
	}
	done := make(chan *Result)
	go func() {
		res, err := Run(context.Background(), Config{Rate: 10, Duration: 500 * time.Millisecond, Concurrency: 1, Session: session, Deps: observe.Deps{Clock: clock}})
		require.NoError(t, err)
		done <- res
	}()
	// Step the clock from event to event, each time once exactly the
	// goroutines that must wait on it do: the scheduler's timer for the
	// next start (until the last start, at 400 ms) and the one running
	// session's 300 ms of work. Sessions start at 0, 300, 600, 900 and
	// 1200 ms (waiters take the one slot in FIFO order) and end 300 ms
	// later.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, step := range []struct {
		waiters int
		advance time.Duration
	}{
		{2, 100 * time.Millisecond}, // t=0: s0 working, next start at 100
		{2, 100 * time.Millisecond}, // t=100: s1 queued
		{2, 100 * time.Millisecond}, // t=200: s2 queued
		{2, 100 * time.Millisecond}, // t=300: s0 done, s1 working, s3 queued
		{1, 200 * time.Millisecond}, // t=400: s4 queued, the last start
		{1, 300 * time.Millisecond}, // t=600: s2 working
		{1, 300 * time.Millisecond}, // t=900: s3 working
		{1, 300 * time.Millisecond}, // t=1200: s4 working, ends at 1500
	} {
		require.NoError(t, clock.BlockUntilContext(ctx, step.waiters))
		clock.Advance(step.advance)
	}
	var res *Result
	select {
	case res = <-done:
	case <-ctx.Done():
		t.Fatal("Run did not return")
	}
	require.EqualValues(t, 5, res.Scheduled)
	require.EqualValues(t, 5, res.Completed)
	// The one slot runs sessions back to back: they end at 300, 600,
	// 900, 1200 and 1500 ms. Queued sessions usually take the slot in
	// schedule order (latency 300 + 200*i: 300 ... 1100), but nothing
	// orders the goroutines' arrival at the queue, so a late-scheduled
	// one may overtake: which session gets which end varies, the sum of
	// latencies (ends minus schedules: 4500 - 1000 ms) does not. A
	// closed-loop tester would report a mean of 300.
	require.InDelta(t, 300, res.Latency.Min, 1)
	require.GreaterOrEqual(t, res.Latency.Max, 1100.0-2)
	require.LessOrEqual(t, res.Latency.Max, 1400.0+2)
	require.InDelta(t, 700, res.Latency.Mean, 2)
	require.Equal(t, []string{"queue", "work"}, []string{res.Phases[0].Name, res.Phases[1].Name})
	require.InDelta(t, res.Latency.Mean, res.Phases[0].Mean+res.Phases[1].Mean, 1)
}

func TestConfigRefusesBadInput(t *testing.T) {
	s := func(context.Context, *Recorder) (io.Closer, error) { return nil, nil }
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Rate: 0, Duration: time.Second, Session: s}, "--rate must be a positive number"},
		{Config{Rate: -1, Duration: time.Second, Session: s}, "--rate must be a positive number"},
		{Config{Rate: 1, Duration: 0, Session: s}, "--duration must be positive"},
		{Config{Rate: 1, Duration: -time.Second, Session: s}, "--duration must be positive"},
		{Config{Rate: 0.5, Duration: time.Second, Session: s}, "schedules no session"},
		{Config{Rate: 1, Duration: time.Second, Hold: -1, Session: s}, "--hold must not be negative"},
	} {
		_, err := Run(context.Background(), tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := SSHSession(SSHConfig{})
	require.ErrorContains(t, err, "missing Credentials")
	_, err = SSHSession(SSHConfig{Credentials: &client.Credentials{}, Target: proxy.Target{Host: "node-1"}})
	require.ErrorContains(t, err, "no login: name one as LOGIN@HOST")
}
