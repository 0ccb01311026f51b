package export

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
)

// TestLogWithHangingWebhook: as the service wires it (exporters made
// first, on the registry the Log then uses), a webhook that hangs never
// holds up Emit: the events past the queue are dropped and counted in the
// Log's own postern_audit_dropped_total, events.log still has every event,
// and Close gives up on the webhook when its grace ends.
func TestLogWithHangingWebhook(t *testing.T) {
	c := newCollector(t)
	c.setHang(true)
	reg := prometheus.NewRegistry()
	xs, err := New(Config{Webhook: c.URL, QueueSize: 4, BatchSize: 1, Deps: observe.Deps{Metrics: reg, Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	dir := t.TempDir()
	log, err := events.NewEmitter(events.Config{Dir: dir, Metrics: reg, Exporters: xs, Clock: clock})
	require.NoError(t, err)

	ctx := context.Background()
	log.Emit(ctx, events.Event{Type: events.SessionStart})
	recv(t, c.got) // in flight, hanging
	for range 9 {
		log.Emit(ctx, events.Event{Type: events.SessionStart})
	}
	flush(t, log)
	data, err := os.ReadFile(filepath.Join(dir, events.FileName))
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(string(data)), "\n"), 10)
	dropped, err := events.DroppedCounter(reg)
	require.NoError(t, err)
	require.Equal(t, 5.0, testutil.ToFloat64(dropped.WithLabelValues(SinkWebhook)))

	closed := make(chan error, 1)
	go func() { closed <- log.Close() }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1)) // Close's grace
	clock.Advance(events.DefaultCloseGrace)
	require.NoError(t, recv(t, closed))
	require.Equal(t, 10.0, testutil.ToFloat64(dropped.WithLabelValues(SinkWebhook)), "the 5 queued are abandoned")
}
