package proxyapi

import (
	"strings"
	"testing"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsEverySubsystem fails when the proxy's SSH port
// gains a subsystem that docs/reference.md does not list.
func TestReferenceDocumentsEverySubsystem(t *testing.T) {
	var subsystems []string
	for name, v := range refdoc.StringConsts(t, ".") {
		if strings.HasPrefix(name, "Subsystem") {
			subsystems = append(subsystems, v)
		}
	}
	if len(subsystems) < 5 {
		t.Fatalf("found only the subsystems %q", subsystems)
	}
	refdoc.Load(t).Section(t, "Proxy SSH port (3023)").RequireCode(t, "subsystems", subsystems...)
}
