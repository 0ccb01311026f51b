package events

import (
	"context"
	"encoding/json"
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
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var start = time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)

type fixture struct {
	dir     string
	clock   *clockwork.FakeClock
	backend backend.Backend
	log     *Log
	reg     *prometheus.Registry
	hook    *test.Hook
}

func newFixture(t *testing.T, mutate func(*Config)) *fixture {
	t.Helper()
	clock := clockwork.NewFakeClockAt(start)
	mem, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	logger, hook := test.NewNullLogger()
	f := &fixture{
		dir:     filepath.Join(t.TempDir(), "log"),
		clock:   clock,
		backend: mem,
		reg:     prometheus.NewRegistry(),
		hook:    hook,
	}
	cfg := Config{Dir: f.dir, Backend: mem, ClusterName: "example", Clock: clock, Logger: logger, Metrics: f.reg}
	if mutate != nil {
		mutate(&cfg)
	}
	f.log, err = NewEmitter(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { f.log.Close() })
	return f
}

func (f *fixture) flush(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, f.log.Flush(ctx))
}

func (f *fixture) lines(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, FileName))
	require.NoError(t, err)
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
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
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestFileAndBackend(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	sid := "7c0d7a4e-0000-4000-8000-000000000001"
	f.log.Emit(ctx, Event{Type: SessionStart, User: "alice", Fields: Fields{
		FieldSessionID: sid, FieldLogin: "root", FieldServerID: "node-uuid",
	}})
	f.clock.Advance(time.Minute)
	f.log.Emit(ctx, Event{Type: SessionEnd, User: "alice", Cluster: "leaf", Fields: Fields{
		FieldSessionID: sid, FieldBytesIn: int64(1234567890123), FieldBytesOut: 42,
	}})
	f.flush(t)

	st, err := os.Stat(f.dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	st, err = os.Stat(filepath.Join(f.dir, FileName))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	lines := f.lines(t)
	require.Len(t, lines, 2)
	// Common keys first, then fields sorted.
	require.Regexp(t, `^\{"event":"session.start","time":"2026-11-30T13:00:00Z","id":"[0-9a-f-]{36}","user":"alice","cluster":"example","login":"root","server_id":"node-uuid","session_id":"`+sid+`"\}$`, lines[0])
	var end Event
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &end))
	require.Equal(t, SessionEnd, end.Type)
	require.Equal(t, "leaf", end.Cluster, "an event's own cluster is kept")
	require.Equal(t, start.Add(time.Minute), end.Time)
	require.Equal(t, json.Number("1234567890123"), end.Fields[FieldBytesIn])
	require.Equal(t, sid, end.Fields[FieldSessionID])

	items, err := f.backend.GetRange(ctx, "/events/", 0)
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.Equal(t, lines[0], string(items[0].Value))
	require.True(t, strings.HasPrefix(items[0].Key, "/events/2026-11-30/"), items[0].Key)
	require.Equal(t, start.Add(DefaultTTL), items[0].Expires)
	require.Equal(t, 1.0, counter(t, f.reg, "postern_audit_events_total", "event", SessionEnd))

	// Reopening appends.
	require.NoError(t, f.log.Close())
	l2, err := NewEmitter(Config{Dir: f.dir, Clock: f.clock})
	require.NoError(t, err)
	l2.Emit(ctx, Event{Type: AuthLogin, User: "bob"})
	require.NoError(t, l2.Close(), "Close drains the queue")
	require.Len(t, f.lines(t), 3)
}

func TestSearchBackend(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.TTL = 3 * 24 * time.Hour })
	ctx := context.Background()
	// Five days, two events a day, 12 hours apart.
	for i := 0; i < 10; i++ {
		typ := AuthLogin
		if i%2 == 1 {
			typ = AccessDenied
		}
		f.log.Emit(ctx, Event{Type: typ, User: fmt.Sprint("u", i)})
		f.clock.Advance(12 * time.Hour)
	}
	f.flush(t)
	users := func(es []Event) (out []string) {
		for _, e := range es {
			out = append(out, e.User)
		}
		return out
	}
	// Now is start+5d; the TTL (3 days) has expired u0..u4 (u4 exactly
	// now: an item expires at its Expires instant).
	all, err := f.log.Search(ctx, time.Time{}, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"u5", "u6", "u7", "u8", "u9"}, users(all))

	denied, err := f.log.Search(ctx, time.Time{}, AccessDenied, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"u5", "u7", "u9"}, users(denied))

	// since is inclusive; limit keeps the most recent, oldest first.
	since := start.Add(7 * 12 * time.Hour)
	got, err := f.log.Search(ctx, since, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"u7", "u8", "u9"}, users(got))
	got, err = f.log.Search(ctx, time.Time{}, "", 2)
	require.NoError(t, err)
	require.Equal(t, []string{"u8", "u9"}, users(got))

	// The backend forgets them with the TTL.
	f.clock.Advance(4 * 24 * time.Hour)
	got, err = f.log.Search(ctx, time.Time{}, "", 0)
	require.NoError(t, err)
	require.Empty(t, got)
}

func TestSearchFile(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Backend = nil })
	ctx := context.Background()
	for i := 0; i < 7; i++ {
		f.log.Emit(ctx, Event{Type: PortForward, User: fmt.Sprint("u", i), Fields: Fields{FieldBytesIn: i}})
		f.clock.Advance(time.Hour)
	}
	f.log.Emit(ctx, Event{Type: AgentForward, User: "agent"})
	f.flush(t)
	got, err := f.log.Search(ctx, start.Add(2*time.Hour), PortForward, 3)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, "u4", got[0].User)
	require.Equal(t, "u6", got[2].User)
	got, err = f.log.Search(ctx, time.Time{}, "", 0)
	require.NoError(t, err)
	require.Len(t, got, 8)
}

// TestConcurrentEmit: many producers, whole lines, nothing lost.
func TestConcurrentEmit(t *testing.T) {
	f := newFixture(t, nil)
	const producers, each = 8, 200
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				f.log.Emit(context.Background(), Event{Type: PortForward, User: fmt.Sprint("p", p), Fields: Fields{"i": i, FieldAddr: strings.Repeat("x", 100)}})
			}
		}(p)
	}
	wg.Wait()
	f.flush(t)
	lines := f.lines(t)
	require.Len(t, lines, producers*each)
	for _, l := range lines {
		var e Event
		require.NoError(t, json.Unmarshal([]byte(l), &e), l)
	}
	items, err := f.backend.GetRange(context.Background(), "/events/", 0)
	require.NoError(t, err)
	require.Len(t, items, producers*each)
}

// slowBackend blocks Create until released (or its ctx ends), or fails it.
type slowBackend struct {
	backend.Backend
	release chan struct{}
	entered chan struct{}
	fail    error
}

func (s *slowBackend) Create(ctx context.Context, item backend.Item) (*backend.Item, error) {
	if s.fail != nil {
		return nil, s.fail
	}
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-s.release:
		return s.Backend.Create(ctx, item)
	case <-ctx.Done():
		return nil, trace.ConnectionProblem(ctx.Err(), "backend unreachable")
	}
}

// TestSlowBackendNeverBlocks: a stuck backend never blocks Emit, never
// costs a line of the file, and drops nothing: its events wait in the file
// (postern_audit_pending counts them), however small the queues; Close
// gives up on it after the grace, leaving them past the cursor for the
// next start.
func TestSlowBackendNeverBlocks(t *testing.T) {
	var slow *slowBackend
	f := newFixture(t, func(c *Config) {
		slow = &slowBackend{Backend: c.Backend, release: make(chan struct{}), entered: make(chan struct{}, 1)}
		c.Backend = slow
		c.QueueSize = 2
		c.BatchSize = 1
		c.BackendTimeout = time.Hour
	})
	// Whatever happens below, unstick the backend before the fixture's
	// Close (cleanups run last-registered first).
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(slow.release) }) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 50; i++ {
		f.log.Emit(context.Background(), Event{Type: SessionStart, User: "alice"})
		// The file keeps up (flushing its sink alone: the backend is
		// stuck).
		require.NoError(t, f.log.sinks[0].flushFor(ctx))
		if i == 0 {
			<-slow.entered
		}
	}
	require.Len(t, f.lines(t), 50)
	require.Zero(t, counter(t, f.reg, "postern_audit_dropped_total", "sink", "backend"))
	require.Zero(t, counter(t, f.reg, "postern_audit_dropped_total", "sink", "file"))
	require.Equal(t, 50.0, gauge(t, f.reg, "postern_audit_pending", "sink", "backend"))

	closed := make(chan error, 1)
	go func() { closed <- f.log.Close() }()
	require.NoError(t, f.clock.BlockUntilContext(ctx, 1))
	f.clock.Advance(DefaultCloseGrace)
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Close did not give up on the stuck backend")
	}
	offset, _, err := readCursor(cursorPath(f.dir, "backend"))
	require.NoError(t, err)
	require.Zero(t, offset, "nothing stored: the next start replays all 50")
	// After Close, Emit is a counted no-op.
	f.log.Emit(context.Background(), Event{Type: SessionEnd})
	require.Equal(t, 1.0, counter(t, f.reg, "postern_audit_dropped_total", "sink", "closed"))
}

func TestConfig(t *testing.T) {
	_, err := NewEmitter(Config{})
	require.True(t, trace.IsBadParameter(err))
	// A file where the directory should be is a clear start-up error.
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, nil, 0o600))
	_, err = NewEmitter(Config{Dir: filepath.Join(p, "log")})
	require.Error(t, err)
}

func TestMarshal(t *testing.T) {
	e := Event{
		Type: AccessDenied, Time: start, User: "eve\nfake", Cluster: "c",
		Fields: Fields{
			"event":       "forged",
			FieldCommand:  strings.Repeat("é", 3000),
			FieldReason:   "line1\nline2\x00",
			"unencodable": make(chan int),
			FieldRoles:    []string{"access"},
		},
	}
	b, err := json.Marshal(e)
	require.NoError(t, err)
	require.NotContains(t, string(b), "\n", "control characters are escaped: one event, one line")
	require.True(t, strings.HasPrefix(string(b), `{"event":"access.denied",`))
	var back Event
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, AccessDenied, back.Type)
	require.Equal(t, "eve\nfake", back.User)
	cmd := back.Fields[FieldCommand].(string)
	require.True(t, strings.HasSuffix(cmd, "...(truncated)"))
	require.LessOrEqual(t, len(cmd), maxStringField+len("...(truncated)"))
	require.Equal(t, "line1\nline2\x00", back.Fields[FieldReason])
	require.Contains(t, back.Fields["unencodable"], "0x")
	require.Equal(t, []any{"access"}, back.Fields[FieldRoles])

	require.Error(t, json.Unmarshal([]byte(`{"event":"x","time":"yesterday"}`), &back))
	require.Error(t, json.Unmarshal([]byte(`[1]`), &back))
}

func TestRecorderAndDiscard(t *testing.T) {
	Discard.Emit(context.Background(), Event{Type: AuthLogin})
	r := NewRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan Event, 1)
	go func() {
		e, err := r.Wait(ctx, SessionEnd, func(e Event) bool { return e.User == "bob" })
		if err == nil {
			got <- e
		}
		close(got)
	}()
	r.Emit(ctx, Event{Type: SessionEnd, User: "alice"})
	r.Emit(ctx, Event{Type: SessionEnd, User: "bob"})
	e, ok := <-got
	require.True(t, ok)
	require.Equal(t, "bob", e.User)
	require.Len(t, r.Events(), 2)

	short, cancel2 := context.WithCancel(ctx)
	cancel2()
	_, err := r.Wait(short, AuthFailed, nil)
	require.Error(t, err)
}

// batchCounter counts the backend's CreateMany calls and their sizes.
type batchCounter struct {
	backend.Backend
	mu      sync.Mutex
	batches []int
	written chan struct{}
}

func (b *batchCounter) CreateMany(ctx context.Context, items []backend.Item) (int, error) {
	n, err := backend.CreateMany(ctx, b.Backend, items)
	b.mu.Lock()
	b.batches = append(b.batches, len(items))
	b.mu.Unlock()
	b.written <- struct{}{}
	return n, err
}

// TestBackendBatchWait: with BatchWait, events emitted within the wait go
// to the backend as one CreateMany (one transaction), written when the
// wait ends, not before; a Flush ends the wait at once.
func TestBackendBatchWait(t *testing.T) {
	bc := &batchCounter{written: make(chan struct{}, 10)}
	// A clock of the log's own: the sink's wait is then its only timer
	// (the memory backend arms its expiry timer on the fixture's).
	clock := clockwork.NewFakeClockAt(start)
	f := newFixture(t, func(c *Config) {
		bc.Backend = c.Backend
		c.Backend = bc
		c.Dir = "" // the backend sink alone
		c.BatchWait = time.Second
		c.Clock = clock
	})
	f.clock = clock
	batches := func() []int {
		bc.mu.Lock()
		defer bc.mu.Unlock()
		return append([]int(nil), bc.batches...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.log.Emit(ctx, Event{Type: SessionStart, User: "alice"})
	// The sink holds the first event and waits on its timer for more.
	require.NoError(t, f.clock.BlockUntilContext(ctx, 1))
	f.log.Emit(ctx, Event{Type: SessionEnd, User: "alice"})
	f.log.Emit(ctx, Event{Type: SessionStart, User: "bob"})
	select {
	case <-bc.written:
		t.Fatal("written before the wait ended")
	default:
	}
	f.clock.Advance(time.Second)
	select {
	case <-bc.written:
	case <-ctx.Done():
		t.Fatal("the batch was not written when the wait ended")
	}
	// The two later events may have reached the queue after the wait's
	// end only if Emit were asynchronous; it is not, so all three are in.
	require.Equal(t, []int{3}, batches())

	// A flush does not wait for the timer.
	f.log.Emit(ctx, Event{Type: SessionEnd, User: "bob"})
	require.NoError(t, f.clock.BlockUntilContext(ctx, 1))
	f.flush(t)
	require.Equal(t, []int{3, 1}, batches())
	items, err := bc.Backend.GetRange(ctx, "/events/", 0)
	require.NoError(t, err)
	require.Len(t, items, 4)
}
