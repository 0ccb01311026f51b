package auth

import (
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsEveryRoute fails when the auth API gains an
// endpoint that docs/reference.md does not list, or when the roles the
// reference gives an endpoint are not exactly those registerRoutes allows:
// the reference's table is read by operators as the API's policy.
func TestReferenceDocumentsEveryRoute(t *testing.T) {
	a := &APIServer{mainMux: http.NewServeMux(), joinMux: http.NewServeMux()}
	a.registerRoutes()
	require.NotEmpty(t, a.routes)
	sec := refdoc.Load(t).Section(t, "Auth API (port 3025)")
	for _, r := range a.routes {
		row, ok := sec.Line(t, r.pattern)
		if !ok {
			continue
		}
		for _, role := range []string{RoleNode, RoleProxy, RoleAdmin, RoleAuth} {
			listed := slices.Contains(refdoc.CodeSpans(row), role)
			if listed != slices.Contains(r.roles, role) {
				t.Errorf("reference row for %s says role %s may call it: %v; registerRoutes says %v (%s)", r.pattern, role, listed, r.roles, row)
			}
		}
	}
}
