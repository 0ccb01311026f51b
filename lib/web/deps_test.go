package web

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWebLinksNoSSHServer: the web terminal and node list decide access
// with lib/authz, the same code the SSH ports use, not with the SSH
// server's internals; lib/web links neither the SSH server nor its proxy
// mode. The go tool's real build graph is asked, so a new import is caught
// the day it is written.
func TestWebLinksNoSSHServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/postern-dev/postern/lib/authz", "the listing is not lib/web's")
	var linked []string
	for _, dep := range deps {
		for _, server := range []string{"github.com/postern-dev/postern/lib/srv", "github.com/postern-dev/postern/lib/proxy/sshproxy"} {
			if dep == server || strings.HasPrefix(dep, server+"/") {
				linked = append(linked, dep)
			}
		}
	}
	require.Empty(t, linked, "lib/web links the SSH server; use lib/authz")
}
