package backend_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/backend/test"
)

func TestInstrumentedIsABackend(t *testing.T) {
	test.RunBackendComplianceSuite(t, func(t *testing.T) (backend.Backend, *clockwork.FakeClock) {
		clock := clockwork.NewFakeClock()
		m, err := memory.New(memory.Config{Clock: clock})
		require.NoError(t, err)
		i, err := backend.NewInstrumented(m, prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		t.Cleanup(func() { i.Close() })
		return i, clock
	})
}

func TestInstrumentedCounts(t *testing.T) {
	m, err := memory.New(memory.Config{})
	require.NoError(t, err)
	defer m.Close()
	reg := prometheus.NewRegistry()
	i, err := backend.NewInstrumented(m, reg, nil)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = i.Put(ctx, backend.Item{Key: "/a", Value: []byte("1"), Expires: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = i.Get(ctx, "/missing")
	require.Error(t, err)
	_, err = i.Put(ctx, backend.Item{Key: "no-slash"})
	require.Error(t, err)
	n, err := testutil.GatherAndCount(reg, "postern_backend_request_duration_seconds")
	require.NoError(t, err)
	require.Equal(t, 2, n, "one series per operation used")
	// NotFound is not an error; the malformed key is.
	want := `# HELP postern_backend_errors_total Backend operations that failed for another reason than NotFound, AlreadyExists or CompareFailed.
# TYPE postern_backend_errors_total counter
postern_backend_errors_total{op="put"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "postern_backend_errors_total"))
}
