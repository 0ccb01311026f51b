package events

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
)

// flakyBackend stands for etcd losing its quorum: while down, every write
// fails with a ConnectionProblem, as the etcd backend's do. partial, when
// set, lets the next failing CreateMany commit that many items first (a
// write whose answer was lost).
type flakyBackend struct {
	backend.Backend
	mu       sync.Mutex
	down     bool
	partial  int
	attempts chan struct{}
}

func newFlaky(b backend.Backend) *flakyBackend {
	return &flakyBackend{Backend: b, attempts: make(chan struct{}, 1000)}
}

func (f *flakyBackend) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

func (f *flakyBackend) CreateMany(ctx context.Context, items []backend.Item) (int, error) {
	f.mu.Lock()
	down, partial := f.down, f.partial
	f.partial = 0
	f.mu.Unlock()
	select {
	case f.attempts <- struct{}{}:
	default:
	}
	if !down {
		return backend.CreateMany(ctx, f.Backend, items)
	}
	if partial > 0 {
		if _, err := backend.CreateMany(ctx, f.Backend, items[:min(partial, len(items))]); err != nil {
			return 0, err
		}
	}
	return 0, trace.ConnectionProblem(nil, "etcdserver: request timed out")
}

func (f *flakyBackend) Create(ctx context.Context, item backend.Item) (*backend.Item, error) {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down {
		return nil, trace.ConnectionProblem(nil, "etcdserver: request timed out")
	}
	return f.Backend.Create(ctx, item)
}

func gauge(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// settle flushes l, advancing clock past every backoff the sinks wait on
// meanwhile.
func settle(t *testing.T, l *Log, clock *clockwork.FakeClock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.Flush(ctx) }()
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		default:
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err := clock.BlockUntilContext(wctx, 1)
		wcancel()
		if err == nil {
			clock.Advance(DefaultRetryMax)
		}
		require.NoError(t, ctx.Err(), "the log did not settle")
	}
}

// storedUsers is how many times each user's events are in the backend.
func storedUsers(t *testing.T, b backend.Backend) map[string]int {
	t.Helper()
	items, err := b.GetRange(context.Background(), "/events/", 0)
	require.NoError(t, err)
	out := map[string]int{}
	for _, it := range items {
		var e Event
		require.NoError(t, e.UnmarshalJSON(it.Value))
		out[e.User]++
	}
	return out
}

func usersOnce(prefix string, n int) map[string]int {
	out := map[string]int{}
	for i := 0; i < n; i++ {
		out[fmt.Sprint(prefix, i)] = 1
	}
	return out
}

// waitAttempt waits for the backend's next write attempt.
func waitAttempt(t *testing.T, f *flakyBackend) {
	t.Helper()
	select {
	case <-f.attempts:
	case <-time.After(10 * time.Second):
		t.Fatal("no backend write attempt")
	}
}

// TestBackendOutageNothingLost: events emitted while the backend fails
// (one write even committing half its batch before failing) are all in it
// once it recovers, none twice; the batch is retried with backoff on the
// clock; postern_audit_pending rises with the outage and returns to 0;
// one error line for the outage, one line when it ends.
func TestBackendOutageNothingLost(t *testing.T) {
	var flaky *flakyBackend
	clock := clockwork.NewFakeClockAt(start) // the Log's alone: the memory backend has timers on the fixture's
	f := newFixture(t, func(c *Config) {
		flaky = newFlaky(c.Backend)
		c.Backend = flaky
		c.Clock = clock
		c.BatchSize = 4
		// The file writes full batches (or what a flush ends), so the
		// backend's first batch is 4 events, whatever the scheduling.
		c.BatchWait = time.Hour
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(flaky.attempts) > 0 {
		<-flaky.attempts
	}
	flaky.mu.Lock()
	flaky.down, flaky.partial = true, 2
	flaky.mu.Unlock()
	for i := 0; i < 10; i++ {
		f.log.Emit(ctx, Event{Type: SessionStart, User: fmt.Sprint("u", i)})
	}
	require.NoError(t, f.log.sinks[0].flushFor(ctx))
	require.Len(t, f.lines(t), 10, "the file has them at once")
	waitAttempt(t, flaky)
	// Retried at 1s, 2s, 4s: each time the same batch, never dropped.
	for _, d := range []time.Duration{DefaultRetryMin, 2 * DefaultRetryMin, 4 * DefaultRetryMin} {
		require.NoError(t, clock.BlockUntilContext(ctx, 1))
		require.Equal(t, 10.0, gauge(t, f.reg, "postern_audit_pending", "sink", "backend"))
		clock.Advance(d)
		waitAttempt(t, flaky)
	}
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.Equal(t, map[string]int{"u0": 1, "u1": 1}, storedUsers(t, f.backend), "the half-committed write")
	require.Equal(t, 16.0, counter(t, f.reg, "postern_audit_write_errors_total", "sink", "backend"), "4 attempts of the first batch of 4")
	// More events during the outage: pending, not dropped.
	for i := 10; i < 15; i++ {
		f.log.Emit(ctx, Event{Type: SessionEnd, User: fmt.Sprint("u", i)})
	}
	require.NoError(t, f.log.sinks[0].flushFor(ctx))
	require.Equal(t, 15.0, gauge(t, f.reg, "postern_audit_pending", "sink", "backend"))

	flaky.setDown(false)
	settle(t, f.log, clock)
	require.Equal(t, usersOnce("u", 15), storedUsers(t, f.backend))
	require.Zero(t, gauge(t, f.reg, "postern_audit_pending", "sink", "backend"))
	require.Zero(t, counter(t, f.reg, "postern_audit_dropped_total", "sink", "backend"))
	var errs, back int
	for _, e := range f.hook.AllEntries() {
		if e.Level == logrus.ErrorLevel && strings.Contains(e.Message, "Cannot write audit events") {
			errs++
		}
		if strings.Contains(e.Message, "stored again") {
			back++
		}
	}
	require.Equal(t, 1, errs, "one error line per outage")
	require.Equal(t, 1, back)
}

// copyDir copies the files of src into a new directory: what a SIGKILL
// leaves on disk at that moment (the file sink's writes are done, and a
// cursor is saved only after its batch is stored).
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "log")
	require.NoError(t, os.MkdirAll(dst, 0o700))
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), data, 0o600))
	}
	return dst
}

// TestBackendOutageSurvivesRestart: a process killed while the backend is
// down, and one closed while it is down (the grace runs out), store the
// events they could not when they start again on the same data dir; what
// was stored before the outage is not doubled.
func TestBackendOutageSurvivesRestart(t *testing.T) {
	var flaky *flakyBackend
	clock := clockwork.NewFakeClockAt(start)
	f := newFixture(t, func(c *Config) {
		flaky = newFlaky(c.Backend)
		c.Backend = flaky
		c.Clock = clock
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		f.log.Emit(ctx, Event{Type: SessionStart, User: fmt.Sprint("u", i)})
	}
	f.flush(t)
	require.Equal(t, usersOnce("u", 3), storedUsers(t, f.backend))

	flaky.setDown(true)
	for len(flaky.attempts) > 0 {
		<-flaky.attempts
	}
	for i := 3; i < 10; i++ {
		f.log.Emit(ctx, Event{Type: SessionEnd, User: fmt.Sprint("u", i)})
	}
	require.NoError(t, f.log.sinks[0].flushFor(ctx))
	waitAttempt(t, flaky)
	killed := copyDir(t, f.dir)

	// Closed during the outage: the grace runs out.
	closed := make(chan error, 1)
	go func() { closed <- f.log.Close() }()
	require.NoError(t, clock.BlockUntilContext(ctx, 2)) // the backoff and the grace
	clock.Advance(DefaultCloseGrace)
	require.NoError(t, <-closed)
	require.Equal(t, usersOnce("u", 3), storedUsers(t, f.backend))
	flaky.setDown(false)

	for _, dir := range []string{killed, f.dir} {
		reg := prometheus.NewRegistry()
		l, err := NewEmitter(Config{Dir: dir, Backend: f.backend, Clock: clock, Metrics: reg, Logger: f.log.log})
		require.NoError(t, err)
		settle(t, l, clock)
		require.Equal(t, usersOnce("u", 10), storedUsers(t, f.backend), dir)
		require.Zero(t, gauge(t, reg, "postern_audit_pending", "sink", "backend"))
		require.NoError(t, l.Close())
	}
}

// TestCursorChecked: a cursor past the end of the file (truncated while
// the process was down) or not at a line's start makes the log store the
// file from its start, once per event; a missing cursor (the first start
// of this version) stores nothing old.
func TestCursorChecked(t *testing.T) {
	f := newFixture(t, nil)
	for i := 0; i < 4; i++ {
		f.log.Emit(context.Background(), Event{Type: SessionStart, User: fmt.Sprint("u", i)})
	}
	f.flush(t)
	require.NoError(t, f.log.Close())
	require.NoError(t, f.backend.DeleteRange(context.Background(), "/events/"))
	path := cursorPath(f.dir, "backend")
	reopen := func() {
		l, err := NewEmitter(Config{Dir: f.dir, Backend: f.backend, Clock: f.clock, Logger: f.log.log})
		require.NoError(t, err)
		f.log = l
		f.flush(t)
		require.NoError(t, l.Close())
	}
	require.NoError(t, os.Remove(path))
	reopen()
	require.Empty(t, storedUsers(t, f.backend), "no cursor: the old lines were the previous version's")

	for _, bad := range []string{"999999 0\n", "7 0\n", "garbage"} {
		require.NoError(t, os.WriteFile(path, []byte(bad), 0o600))
		reopen()
		require.Equal(t, usersOnce("u", 4), storedUsers(t, f.backend), bad)
	}
}
