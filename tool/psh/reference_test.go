package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsEveryCommand fails when psh gains a command or a
// flag that docs/reference.md does not describe. It reads the command tree
// from psh's own --help-long, which lists every command and flag (the
// kingpin application lives inside run, out of a test's reach).
func TestReferenceDocumentsEveryCommand(t *testing.T) {
	// kingpin writes --help-long to os.Stdout itself, whatever the
	// application's usage writer.
	path := filepath.Join(t.TempDir(), "help-long")
	f, err := os.Create(path)
	require.NoError(t, err)
	stdout := os.Stdout
	os.Stdout = f
	_, _, err = runPsh(t, "--help-long")
	os.Stdout = stdout
	require.NoError(t, err)
	require.NoError(t, f.Close())
	out, err := os.ReadFile(path)
	require.NoError(t, err)

	global, cmds := refdoc.FromHelpLong(string(out))
	// The parse must see the tree, or the test proves nothing.
	require.Contains(t, global, "home")
	i := slices.IndexFunc(cmds, func(c refdoc.Command) bool { return c.Name == "proxy ssh" })
	require.GreaterOrEqual(t, i, 0, "no proxy ssh in %v", cmds)
	require.Contains(t, cmds[i].Flags, "cluster")
	refdoc.Load(t).RequireCLI(t, "psh", "`psh`: the user CLI", global, cmds)
}
