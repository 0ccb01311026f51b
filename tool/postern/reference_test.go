package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsEveryCommand fails when postern gains a command or
// a flag that docs/reference.md does not describe.
func TestReferenceDocumentsEveryCommand(t *testing.T) {
	app, _, _, _ := newApp(&startFlags{})
	global, cmds := refdoc.FromKingpin(app)
	require.NotEmpty(t, cmds)
	refdoc.Load(t).RequireCLI(t, "postern", "`postern`: the daemon", global, cmds)
}
