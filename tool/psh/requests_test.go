package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRequestCommandsRefuseBadUse: the request commands' mistakes are
// named before anything is dialed; without a login each says to log in.
func TestRequestCommandsRefuseBadUse(t *testing.T) {
	home := t.TempDir()
	for args, want := range map[*[]string]string{
		{"login", "--request-id", "x", "--user", "alice"}: "takes no --user or --auth",
		{"login", "--wait"}:   "--wait is for --request-id",
		{"login"}:             "--proxy",
		{"request", "create"}: "--roles",
		{"request", "create", "--roles", "dba", "--ttl", "-1h"}: "--ttl",
		{"request", "create", "--roles", "dba"}:                 "psh login",
		{"request", "ls"}:                                       "psh login",
		{"request", "approve", "x"}:                             "psh login",
		{"login", "--request-id", "x"}:                          "psh login",
	} {
		_, _, err := runPsh(t, append([]string{"--home", home}, (*args)...)...)
		require.ErrorContains(t, err, want, *args)
	}
	require.Equal(t, []string{"dba", "ops", "x"}, splitRoles([]string{"dba, ops", ",x,"}))
}
