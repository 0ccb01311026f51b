package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// serverPackages are what psh must never link: the node and proxy SSH
// servers, the web server (and with it the embedded UI), the process
// wiring, and the auth server. A client that links them grows by
// megabytes, starts their init code, and, worse, lets a change to a
// server's internals change what the client sends. psh speaks to
// servers through lib/api's wire types only.
var serverPackages = []string{
	"github.com/postern-dev/postern/lib/srv",
	"github.com/postern-dev/postern/lib/web",
	"github.com/postern-dev/postern/lib/service",
	"github.com/postern-dev/postern/lib/auth",
}

// TestPshLinksNoServer asks the go tool what psh links: the real build
// graph, so a new import anywhere below lib/client is caught the day it is
// written.
func TestPshLinksNoServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/postern-dev/postern/lib/client", "the listing is not psh's")
	var linked []string
	for _, dep := range deps {
		for _, server := range serverPackages {
			if dep == server || strings.HasPrefix(dep, server+"/") {
				linked = append(linked, dep)
			}
		}
	}
	require.Empty(t, linked, "psh links server packages; use lib/api's types instead")
}
