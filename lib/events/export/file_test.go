package export

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func readLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func testFile(t *testing.T, path string) (*File, chan struct{}) {
	x, err := newFile(Config{File: path, Deps: observe.Deps{Metrics: prometheus.NewRegistry()}})
	require.NoError(t, err)
	reopened := make(chan struct{}, 10)
	x.onReopen = func() { reopened <- struct{}{} }
	x.start()
	t.Cleanup(func() { require.NoError(t, x.Close(context.Background())) })
	return x, reopened
}

// TestFileRotation: the file is created 0600 and appended to; renamed
// away (logrotate's create), the next batch goes to a new file at the
// path, and the renamed one keeps what it had.
func TestFileRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "audit.jsonl")
	_, err := newFile(Config{File: path})
	require.Error(t, err, "a missing directory is an error, not created")

	path = filepath.Join(t.TempDir(), "audit.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("{\"old\":1}\n"), 0o600))
	x, reopened := testFile(t, path)
	for _, l := range lines(0, 2) {
		x.Export([]byte(l))
	}
	flush(t, x)
	require.Equal(t, append([]string{`{"old":1}`}, lines(0, 2)...), readLines(t, path))

	require.NoError(t, os.Rename(path, path+".1"))
	x.Export([]byte(lines(2, 3)[0]))
	flush(t, x)
	require.Len(t, reopened, 1)
	require.Equal(t, lines(2, 3), readLines(t, path))
	require.Len(t, readLines(t, path+".1"), 3)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.Zero(t, testutil.ToFloat64(x.m.dropped))
}

// TestFileSIGHUP: SIGHUP reopens the file at once, before any event, as
// logrotate's postrotate expects.
func TestFileSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	x, reopened := testFile(t, path)
	x.Export([]byte(lines(0, 1)[0]))
	flush(t, x)
	require.NoError(t, os.Rename(path, path+".1"))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	recv(t, reopened)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Zero(t, fi.Size())
	x.Export([]byte(lines(1, 2)[0]))
	flush(t, x)
	require.Equal(t, lines(1, 2), readLines(t, path))
}

// TestFileUnwritable: when the path cannot be opened again (its directory
// went away), the events are counted as dropped rather than written to
// the file nobody will read; once it can, writing resumes there.
func TestFileUnwritable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	require.NoError(t, os.Mkdir(dir, 0o700))
	path := filepath.Join(dir, "audit.jsonl")
	x, reopened := testFile(t, path)
	require.NoError(t, os.Rename(dir, dir+".gone"))
	x.Export([]byte(lines(0, 1)[0]))
	flush(t, x)
	require.Equal(t, 1.0, testutil.ToFloat64(x.m.dropped))

	require.NoError(t, os.Mkdir(dir, 0o700))
	x.Export([]byte(lines(1, 2)[0]))
	flush(t, x)
	recv(t, reopened)
	require.Equal(t, lines(1, 2), readLines(t, path))
	require.Equal(t, 1.0, testutil.ToFloat64(x.m.dropped))
}

// TestFileRotationBySize: past audit.max_size_bytes the file moves to
// FILE.1 (older ones shift up, the oldest past max_files goes) and a new
// file is started; no line is lost or split between files.
func TestFileRotationBySize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	line := lines(0, 1)[0]
	// Two lines reach the size: each flushed pair of lines rotates.
	x, err := newFile(Config{File: path, MaxSizeBytes: int64(2 * (len(line) + 1)), MaxFiles: 2, Deps: observe.Deps{Metrics: prometheus.NewRegistry()}})
	require.NoError(t, err)
	x.start()
	defer func() { require.NoError(t, x.Close(context.Background())) }()
	for i := 0; i < 4; i++ {
		for _, l := range lines(2*i, 2*i+2) {
			x.Export([]byte(l))
		}
		flush(t, x)
	}
	x.Export([]byte(lines(8, 9)[0]))
	flush(t, x)
	require.Equal(t, lines(8, 9), readLines(t, path), "the live file")
	require.Equal(t, lines(6, 8), readLines(t, path+".1"), "the newest rotated")
	require.Equal(t, lines(4, 6), readLines(t, path+".2"))
	_, err = os.Stat(path + ".3")
	require.True(t, os.IsNotExist(err), "max_files 2 keeps two")
	require.Zero(t, testutil.ToFloat64(x.m.dropped))
}
