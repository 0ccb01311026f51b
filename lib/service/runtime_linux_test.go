package service

import (
	"os"
	"runtime/debug"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
)

// currentGCPercent reads the GC target without changing it.
func currentGCPercent() int {
	pct := debug.SetGCPercent(100)
	debug.SetGCPercent(pct)
	return pct
}

func TestSetGCPercent(t *testing.T) {
	orig := currentGCPercent()
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	log, _ := test.NewNullLogger()

	t.Setenv("GOGC", "")
	debug.SetGCPercent(100)
	setGCPercent(&config.Config{}, log)
	require.Equal(t, config.DefaultGCPercent, currentGCPercent(), "no gc_percent, no GOGC: the default")

	debug.SetGCPercent(100)
	setGCPercent(&config.Config{FileConfig: config.FileConfig{GCPercent: 250}}, log)
	require.Equal(t, 250, currentGCPercent(), "gc_percent wins")

	// GOGC set: the runtime applied it at start; the daemon keeps it.
	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150)
	setGCPercent(&config.Config{}, log)
	require.Equal(t, 150, currentGCPercent(), "GOGC is the operator's choice")
}

// TestRaiseFileLimit: a daemon started with a low soft limit gets the
// hard one, and says so.
func TestRaiseFileLimit(t *testing.T) {
	var orig syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig))
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	if orig.Max < 512 {
		// CI's machines have a hard limit of 20,000: there this is a
		// failure, never a silent skip.
		if os.Getenv("CI") != "" {
			t.Fatalf("hard RLIMIT_NOFILE %d too low to test raising the soft one", orig.Max)
		}
		t.Skipf("hard RLIMIT_NOFILE %d too low to lower the soft one", orig.Max)
	}
	low := syscall.Rlimit{Cur: 256, Max: orig.Max}
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))

	log, hook := test.NewNullLogger()
	raiseFileLimit(log)

	var now syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now))
	require.Equal(t, orig.Max, now.Cur)
	e := hook.LastEntry()
	require.NotNil(t, e)
	require.Equal(t, logrus.InfoLevel, e.Level)
	require.Contains(t, e.Message, "RLIMIT_NOFILE")
	require.EqualValues(t, 256, e.Data["from"])
	require.EqualValues(t, orig.Max, e.Data["to"])
}
