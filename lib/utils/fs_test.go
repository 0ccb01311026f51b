package utils

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	require.NoError(t, WriteFileAtomic(path, []byte("one"), 0o600))
	require.NoError(t, WriteFileAtomic(path, []byte("two"), 0o600))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "two", string(data))
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left behind")

	err = WriteFileAtomic(filepath.Join(dir, "missing", "key"), []byte("x"), 0o600)
	require.Error(t, err)
}

// TestWriteFilesAtomicIgnoresPlantedFiles is the attack on `pctl auth sign
// --out P`: someone who can write to P's directory plants P.tmp (a symlink
// to a file they want overwritten, or a file of their own they can read)
// before the key is written. Neither may receive the private key.
func TestWriteFilesAtomicIgnoresPlantedFiles(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "robot")
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("victim"), 0o644))
	require.NoError(t, os.Symlink(victim, out+".tmp"))
	planted := out + ".pub.tmp"
	require.NoError(t, os.WriteFile(planted, []byte("planted"), 0o666))

	require.NoError(t, WriteFilesAtomic([]File{
		{Path: out, Data: []byte("PRIVATE"), Mode: 0o600},
		{Path: out + ".pub", Data: []byte("public"), Mode: 0o644},
	}))

	data, err := os.ReadFile(victim)
	require.NoError(t, err)
	require.Equal(t, "victim", string(data), "the symlink was followed")
	data, err = os.ReadFile(planted)
	require.NoError(t, err)
	require.Equal(t, "planted", string(data), "the planted file was reused")
	data, err = os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, "PRIVATE", string(data))
	st, err := os.Lstat(out)
	require.NoError(t, err)
	require.True(t, st.Mode().IsRegular())
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	st, err = os.Stat(out + ".pub")
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), st.Mode().Perm())
}

// TestWriteFilesAtomicAllOrNothing: when one file cannot be written, none
// of them appears and no temporary is left behind.
func TestWriteFilesAtomicAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	err := WriteFilesAtomic([]File{
		{Path: filepath.Join(dir, "key"), Data: []byte("k"), Mode: 0o600},
		{Path: filepath.Join(dir, "missing", "key.pub"), Data: []byte("p"), Mode: 0o644},
	})
	require.Error(t, err)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries)
}
