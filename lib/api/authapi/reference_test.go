package authapi

import (
	"strings"
	"testing"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsEveryErrorKind fails when the API gains an error
// kind that docs/reference.md does not list.
func TestReferenceDocumentsEveryErrorKind(t *testing.T) {
	var kinds []string
	for name, v := range refdoc.StringConsts(t, ".") {
		if strings.HasPrefix(name, "Kind") {
			kinds = append(kinds, v)
		}
	}
	if len(kinds) < 9 {
		t.Fatalf("found only the error kinds %q", kinds)
	}
	refdoc.Load(t).Section(t, "API errors").RequireCode(t, "error kinds", kinds...)
}
