package service

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
)

func TestChangedKeys(t *testing.T) {
	a := config.FileConfig{ClusterName: "one", Debug: false, Limits: config.Limits{MaxConnections: 10}}
	b := config.FileConfig{ClusterName: "two", Debug: true, Limits: config.Limits{MaxConnections: 20}, LogFormat: "json"}
	require.Equal(t, []string{"cluster_name", "limits"}, changedKeys(a, b, "debug", "log_format"))
	require.Empty(t, changedKeys(a, a))
}

// A reload applies debug and log_format from the file, keeps a --debug
// given at start, names the keys that need a restart, and refuses an
// invalid file without changing anything.
func TestReloadLogging(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "postern.yaml")
	write := func(s string) { require.NoError(t, os.WriteFile(path, []byte(s), 0o600)) }
	write("cluster_name: one\n")
	fc, err := config.ReadFile(path)
	require.NoError(t, err)
	cfg := &config.Config{FileConfig: *fc, ConfigFile: path}
	cfg.DataDir = dir
	p, err := New(cfg, Options{})
	require.NoError(t, err)
	var out bytes.Buffer
	logger := p.log.(*logrus.Entry).Logger
	logger.SetOutput(&out)
	h := p.startDaemonHooks()
	defer h.stop()
	require.Equal(t, logrus.InfoLevel, logger.GetLevel())

	write("cluster_name: two\ndebug: true\nlog_format: json\n")
	h.reload()
	require.Equal(t, logrus.DebugLevel, logger.GetLevel())
	require.IsType(t, &logrus.JSONFormatter{}, logger.Formatter)
	require.Contains(t, out.String(), `"needs_restart":"cluster_name"`)

	out.Reset()
	write("cluster_name: two\nbogus: 1\n")
	h.reload()
	require.Equal(t, logrus.DebugLevel, logger.GetLevel(), "an invalid file changes nothing")
	require.Contains(t, out.String(), "Reload refused")

	write("cluster_name: two\n")
	h.reload()
	require.Equal(t, logrus.InfoLevel, logger.GetLevel())
	require.IsType(t, &logrus.TextFormatter{}, logger.Formatter)

	// A --debug flag at start (debug not in the file) survives reloads.
	cfg2 := &config.Config{FileConfig: *fc, ConfigFile: path}
	cfg2.DataDir = dir
	cfg2.Debug = true
	p2, err := New(cfg2, Options{})
	require.NoError(t, err)
	p2.log.(*logrus.Entry).Logger.SetOutput(&out)
	h2 := p2.startDaemonHooks()
	defer h2.stop()
	h2.reload()
	require.Equal(t, logrus.DebugLevel, p2.log.(*logrus.Entry).Logger.GetLevel())
}
