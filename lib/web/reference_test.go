package web

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsEveryRoute fails when the proxy's HTTPS port gains
// an endpoint that docs/reference.md's web API section does not list.
func TestReferenceDocumentsEveryRoute(t *testing.T) {
	// Read from the source: the routes are registered in several files.
	routes := refdoc.Routes(t, ".")
	require.Contains(t, routes, "POST /webapi/sessions/token")
	require.Contains(t, routes, "GET "+JoinRelayPath)
	refdoc.Load(t).Section(t, "Web API (port 3080)").RequireCode(t, "web routes", routes...)
}
