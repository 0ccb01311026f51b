package observe

import (
	"sort"
	"strings"
	"testing"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsEveryComponent: every fixed component name is in
// the reference's log section, so that an operator's log query can rely
// on the list.
func TestReferenceDocumentsEveryComponent(t *testing.T) {
	var names []string
	for name, v := range refdoc.StringConsts(t, ".") {
		if strings.HasPrefix(name, "Component") {
			names = append(names, v)
		}
	}
	sort.Strings(names)
	if len(names) < 20 {
		t.Fatalf("found %d component names in the source: the reader is broken", len(names))
	}
	refdoc.Load(t).Section(t, "Logs").RequireCode(t, "component names", names...)
}
