package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseEscapeChar: -e takes a character, ^X or none, as OpenSSH's.
func TestParseEscapeChar(t *testing.T) {
	for in, want := range map[string]byte{"~": '~', "%": '%', "^]": 0x1d, "none": 0} {
		got, err := parseEscapeChar(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "ab", "^a", "~~"} {
		_, err := parseEscapeChar(in)
		require.ErrorContains(t, err, "invalid escape character", in)
	}
}

// TestParseScpPath: a colon before any slash names a node, as scp reads
// its arguments.
func TestParseScpPath(t *testing.T) {
	for in, want := range map[string]scpPath{
		"node:/tmp/x":        {host: "node", path: "/tmp/x"},
		"root@node:rel":      {host: "root@node", path: "rel"},
		"node:":              {host: "node", path: "."},
		"./a:b":              {path: "./a:b"},
		"/x:y":               {path: "/x:y"},
		"plain":              {path: "plain"},
		":weird":             {path: ":weird"},
		"node.leaf:/var/log": {host: "node.leaf", path: "/var/log"},
	} {
		require.Equal(t, want, parseScpPath(in), in)
	}
}

// TestVersionFlag: --version and -V print what `psh version` does, also
// after global flags, and not when they belong to a remote command.
func TestVersionFlag(t *testing.T) {
	want, _, err := runPsh(t, "version")
	require.NoError(t, err)
	for _, args := range [][]string{{"--version"}, {"-V"}, {"--debug", "--version"}} {
		out, _, err := runPsh(t, args...)
		require.NoError(t, err, args)
		require.Equal(t, want, out, args)
	}
	require.False(t, versionAsked([]string{"ssh", "node", "prog", "--version"}))
}
