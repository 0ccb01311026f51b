package webterm

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeaf: the wire package must not pull in Postern's servers, or a
// client that speaks the protocol links the proxy.
func TestLeaf(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		// lib/api itself (the one strict JSON decoder) is a leaf too.
		if strings.HasPrefix(dep, "github.com/postern-dev/postern/") && !strings.HasPrefix(dep, "github.com/postern-dev/postern/lib/api") {
			t.Errorf("webterm imports %s", dep)
		}
	}
}
