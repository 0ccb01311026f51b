package api

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLeaf keeps lib/api a leaf: of Postern's own packages, it and its
// sub-packages may import only each other and the data-type packages
// listed here. A wire type that needs a server's type is a sign the type
// belongs here instead.
func TestLeaf(t *testing.T) {
	allowed := map[string]bool{
		"github.com/postern-dev/postern/lib/services": true,
		"github.com/postern-dev/postern/lib/events":   true,
		"github.com/postern-dev/postern/lib/backend":  true,
		// backoff is a leaf too (no Postern imports): the watchers in
		// services and the audit shipper in events retry with it.
		"github.com/postern-dev/postern/lib/backoff": true,
		// promreg too: events registers its counters with it.
		"github.com/postern-dev/postern/lib/promreg": true,
	}
	out, err := exec.Command("go", "list", "-deps", "./...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var bad []string
	for _, dep := range strings.Fields(string(out)) {
		if !strings.HasPrefix(dep, "github.com/postern-dev/postern/") || allowed[dep] ||
			strings.HasPrefix(dep, "github.com/postern-dev/postern/lib/api") {
			continue
		}
		bad = append(bad, dep)
	}
	require.Empty(t, bad, "lib/api must import nothing of Postern's servers")
}
