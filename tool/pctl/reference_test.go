package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsEveryCommand fails when pctl gains a command or a
// flag that docs/reference.md does not describe.
func TestReferenceDocumentsEveryCommand(t *testing.T) {
	app, cmds := (&cli{}).newApp()
	global, tree := refdoc.FromKingpin(app)
	// Every command the tree lists is one run can dispatch, and back.
	require.Len(t, tree, len(cmds))
	for _, c := range tree {
		require.Contains(t, cmds, c.Name)
	}
	refdoc.Load(t).RequireCLI(t, "pctl", "`pctl`: the admin CLI", global, tree)
}
