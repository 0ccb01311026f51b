package memory

import (
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/test"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newFake(t *testing.T) (backend.Backend, *clockwork.FakeClock) {
	clock := clockwork.NewFakeClock()
	m, err := New(Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m, clock
}

func TestMemoryFakeClock(t *testing.T) {
	test.RunBackendComplianceSuite(t, newFake)
}

// The real-clock path exercises the sweeper's real timer.
func TestMemoryRealClock(t *testing.T) {
	test.RunBackendComplianceSuite(t, func(t *testing.T) (backend.Backend, *clockwork.FakeClock) {
		m, err := New(Config{})
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		return m, nil
	})
}

func BenchmarkMemory(b *testing.B) {
	test.RunBackendBenchmarks(b, func(b *testing.B) backend.Backend {
		m, err := New(Config{})
		require.NoError(b, err)
		b.Cleanup(func() { m.Close() })
		return m
	})
}
