package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func runPsh(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, os.Stdin, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestCommands(t *testing.T) {
	home := t.TempDir()
	out, _, err := runPsh(t, "version")
	require.NoError(t, err)
	require.Equal(t, "psh dev\n", out)

	out, _, err = runPsh(t, "--help")
	require.NoError(t, err)
	for _, cmd := range []string{"login", "ls", "ssh", "proxy ssh", "config", "status", "logout", "version"} {
		require.Contains(t, out, cmd)
	}

	_, _, err = runPsh(t, "frobnicate")
	require.True(t, trace.IsBadParameter(err))
	require.Contains(t, err.Error(), "psh --help")

	for _, args := range [][]string{{"status"}, {"ls"}, {"config"}, {"logout"}, {"ssh", "node", "true"}, {"proxy", "ssh", "root@node:22"}} {
		_, _, err := runPsh(t, append([]string{"--home", home}, args...)...)
		require.Error(t, err, args)
		require.Contains(t, err.Error(), "psh login", args)
	}

	_, _, err = runPsh(t, "--home", home, "ssh", "-L", "nonsense", "node", "true")
	require.Error(t, err)
	_, _, err = runPsh(t, "login", "--user", "alice")
	require.ErrorContains(t, err, "--proxy")
	entries, err := os.ReadDir(home)
	require.NoError(t, err)
	require.Empty(t, entries)
	require.NoFileExists(t, filepath.Join(home, client.ProfileFile))
}

func TestSplitLogin(t *testing.T) {
	for in, want := range map[string][2]string{
		"node":            {"", "node"},
		"root@node":       {"root", "node"},
		"a@b@node:22":     {"a@b", "node:22"},
		"root@[::1]:3022": {"root", "[::1]:3022"},
	} {
		l, h := splitLogin(in)
		require.Equal(t, want, [2]string{l, h}, in)
	}
}
