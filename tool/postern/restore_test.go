package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/backup"
	"github.com/postern-dev/postern/lib/backend/etcdbk"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/backend/sqlite"
)

// writeBackup writes a backup of a SQLite backend holding a user and the
// schema record, and returns its path and the items it holds.
func writeBackup(t *testing.T) (string, []backend.Item) {
	ctx := context.Background()
	b, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "postern.db")})
	require.NoError(t, err)
	defer b.Close()
	for _, it := range []backend.Item{
		{Key: "/schema/version", Value: []byte(`{"version":1}`)},
		{Key: "/users/alice", Value: []byte(`{"name":"alice"}`)},
	} {
		_, err := b.Put(ctx, it)
		require.NoError(t, err)
	}
	path := filepath.Join(t.TempDir(), "postern.backup")
	var buf bytes.Buffer
	_, err = backup.Write(ctx, &buf, b, backup.Header{ClusterName: "c1"})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o600))
	items, err := b.GetRange(ctx, "/", 0)
	require.NoError(t, err)
	return path, items
}

func restoreCmd(t *testing.T, args ...string) (string, error) {
	var f startFlags
	app, _, _, restore := newApp(&f)
	cmd, err := app.Parse(append([]string{"restore"}, args...))
	require.NoError(t, err)
	require.Equal(t, restore.FullCommand(), cmd)
	var out bytes.Buffer
	err = f.restore.run(context.Background(), &out)
	return out.String(), err
}

func keysOf(items []backend.Item) []string {
	var keys []string
	for _, it := range items {
		keys = append(keys, it.Key)
	}
	return keys
}

func TestRestoreIntoFreshDataDir(t *testing.T) {
	file, items := writeBackup(t)
	dir := filepath.Join(t.TempDir(), "new")
	out, err := restoreCmd(t, "--data-dir", dir, file)
	require.NoError(t, err)
	require.Contains(t, out, `Restored 2 items of cluster "c1"`)
	require.Contains(t, out, "--cluster-name c1")
	st, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	name, err := os.ReadFile(filepath.Join(dir, "cluster_name"))
	require.NoError(t, err)
	require.Equal(t, "c1\n", string(name))

	b, err := sqlite.New(context.Background(), sqlite.Config{Path: filepath.Join(dir, "backend", "postern.db")})
	require.NoError(t, err)
	defer b.Close()
	got, err := b.GetRange(context.Background(), "/", 0)
	require.NoError(t, err)
	require.Equal(t, keysOf(items), keysOf(got))

	// An empty existing directory is fine too.
	empty := t.TempDir()
	_, err = restoreCmd(t, "--data-dir", empty, file)
	require.NoError(t, err)
}

// TestRestoreRefusesNonEmptyDataDir names the directory and touches
// nothing in it.
func TestRestoreRefusesNonEmptyDataDir(t *testing.T) {
	file, _ := writeBackup(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "host_uuid"), []byte("x"), 0o600))
	_, err := restoreCmd(t, "--data-dir", dir, file)
	require.ErrorContains(t, err, "data dir "+dir+" is not empty (it holds host_uuid)")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
}

// TestRestoreOfABadBackupLeavesNothing: a damaged backup is refused before
// anything is created, and one that breaks midway is undone.
func TestRestoreOfABadBackupLeavesNothing(t *testing.T) {
	file, _ := writeBackup(t)
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	cut := filepath.Join(t.TempDir(), "cut.backup")
	require.NoError(t, os.WriteFile(cut, data[:len(data)-12], 0o600))
	dir := filepath.Join(t.TempDir(), "new")
	_, err = restoreCmd(t, "--data-dir", dir, cut)
	require.Error(t, err)
	require.NoDirExists(t, dir)

	_, err = restoreCmd(t, "--data-dir", dir, filepath.Join(t.TempDir(), "missing"))
	require.Error(t, err)
	require.NoDirExists(t, dir)
}

// TestRestoreIntoEtcd: with a config naming an etcd backend the backup
// goes under its prefix, which must be empty.
func TestRestoreIntoEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	file, items := writeBackup(t)
	cfg := filepath.Join(t.TempDir(), "postern.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("cluster_name: c1\nbackend:\n  type: etcd\n  etcd_endpoints: ["+srv.Endpoints[0]+"]\n  etcd_prefix: /restored\n"), 0o600))
	out, err := restoreCmd(t, "--config", cfg, file)
	require.NoError(t, err)
	require.Contains(t, out, "etcd prefix /restored")

	b, err := etcdbk.New(context.Background(), etcdbk.Config{Endpoints: srv.Endpoints, Prefix: "/restored"})
	require.NoError(t, err)
	defer b.Close()
	got, err := b.GetRange(context.Background(), "/", 0)
	require.NoError(t, err)
	require.Equal(t, keysOf(items), keysOf(got))

	// Again: the prefix is not empty any more.
	_, err = restoreCmd(t, "--config", cfg, file)
	require.ErrorContains(t, err, "etcd prefix /restored")
	require.ErrorContains(t, err, "not empty")

	// A config of another cluster is refused.
	other := filepath.Join(t.TempDir(), "other.yaml")
	require.NoError(t, os.WriteFile(other, []byte("cluster_name: c2\n"), 0o600))
	_, err = restoreCmd(t, "--config", other, "--data-dir", t.TempDir(), file)
	require.ErrorContains(t, err, `the backup is of cluster "c1"`)
}
