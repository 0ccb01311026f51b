package service

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/refdoc"
)

// TestReferenceDocumentsListenersAndDiagnostics fails when a process gains
// a listener (a Listener* name, which logs, metrics and conn.refused
// carry) or a diagnostics endpoint that docs/reference.md's ports section
// does not list.
func TestReferenceDocumentsListenersAndDiagnostics(t *testing.T) {
	var listeners []string
	for name, v := range refdoc.StringConsts(t, ".") {
		if strings.HasPrefix(name, "Listener") {
			listeners = append(listeners, v)
		}
	}
	require.Contains(t, listeners, ListenerTunnel)
	require.Contains(t, listeners, ListenerPeer)
	routes := refdoc.Routes(t, ".")
	require.Contains(t, routes, "/readyz")
	sec := refdoc.Load(t).Section(t, "Ports")
	sec.RequireCode(t, "listener names", listeners...)
	sec.RequireCode(t, "diagnostics endpoints", routes...)
}
