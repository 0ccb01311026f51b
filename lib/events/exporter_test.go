package events

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// exportRecorder is an Exporter keeping what it is given.
type exportRecorder struct {
	mu     sync.Mutex
	lines  []string
	closed bool
}

func (r *exportRecorder) Export(line []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		panic("Export after Close")
	}
	r.lines = append(r.lines, string(line))
}

func (r *exportRecorder) Close(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return nil
}

func (r *exportRecorder) got() ([]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...), r.closed
}

// TestExporters: every event this process emits reaches the exporters as
// its line in events.log; events other hosts ship (Store) do not (their
// host exports them); Close closes the exporters, and nothing is exported
// after it.
func TestExporters(t *testing.T) {
	x := &exportRecorder{}
	f := newFixture(t, func(c *Config) { c.Exporters = []Exporter{x} })
	ctx := context.Background()
	f.log.Emit(ctx, Event{Type: SessionStart, User: "alice"})
	f.log.Emit(ctx, Event{Type: SessionEnd, User: "alice"})
	require.NoError(t, f.log.Store(ctx, []Event{{Type: SessionStart, User: "bob", ID: "shipped"}}))
	f.flush(t)
	lines, closed := x.got()
	require.False(t, closed)
	require.Equal(t, f.lines(t)[:2], lines)
	require.Len(t, f.lines(t), 3)

	require.NoError(t, f.log.Close())
	f.log.Emit(ctx, Event{Type: SessionStart, User: "carol"})
	lines, closed = x.got()
	require.True(t, closed)
	require.Len(t, lines, 2)

	y := &exportRecorder{}
	_, err := NewEmitter(Config{Exporters: []Exporter{y}})
	require.Error(t, err)
	_, closed = y.got()
	require.True(t, closed, "NewEmitter closes the exporters it was given when it fails")
}
