package sqlite

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
)

// TestStoreGoneIsConnectionProblem: when the database can no longer be
// used (its directory removed under the running process, the file
// overwritten by something else), operations fail with ConnectionProblem
// ("unavailable, try again later" to users), not an unclassified driver
// error that callers can only report as an internal error.
func TestStoreGoneIsConnectionProblem(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "postern.db")
	b, err := New(ctx, Config{Path: path})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	_, err = b.Put(ctx, backend.Item{Key: "/a", Value: []byte("x")})
	require.NoError(t, err)

	// Something overwrites the file in place: not a database any more.
	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte("garbage!"), 1024), 0o600))
	for _, p := range []string{path + "-wal", path + "-shm"} {
		if _, err := os.Stat(p); err == nil {
			require.NoError(t, os.WriteFile(p, bytes.Repeat([]byte("garbage!"), 1024), 0o600))
		}
	}
	_, err = b.Put(ctx, backend.Item{Key: "/b", Value: []byte("x")})
	requireUnavailable(t, err)
	_, err = b.Get(ctx, "/a")
	requireUnavailable(t, err)

	// The directory is removed under the process: reads cannot open it.
	require.NoError(t, os.RemoveAll(dir))
	_, err = b.GetRange(ctx, "/", 0)
	requireUnavailable(t, err)
}

func requireUnavailable(t *testing.T, err error) {
	t.Helper()
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.Contains(t, err.Error(), "sqlite backend is unavailable")
}
