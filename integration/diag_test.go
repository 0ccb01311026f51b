package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/service"
)

// TestDiagnostics: the diagnostics port tells an operator what the process
// is doing: routing, backend latency, the NodeWatcher, caps and audit.
func TestDiagnostics(t *testing.T) {
	c := newAllInOne(t)
	clt, err := c.viaJump(t, c.hostname+":0")
	require.NoError(t, err)
	_, err = run(t, clt, "true")
	require.NoError(t, err)

	base := "http://" + c.p.Addr(service.ListenerDiag).String()
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code, body)

	code, body = get("/readyz")
	require.Equal(t, http.StatusOK, code, body)
	var ready map[string]string
	require.NoError(t, json.Unmarshal([]byte(body), &ready))
	for _, k := range []string{"backend", "node_watcher", "accept_proxy_ssh", "accept_node", "accept_auth", "accept_web"} {
		require.Equal(t, "ok", ready[k], "readyz %s: %v", k, ready)
	}

	code, body = get("/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, m := range []string{
		"postern_proxy_route_duration_seconds_count 1",
		`postern_backend_request_duration_seconds_count{op="put"}`,
		"postern_nodewatcher_nodes 1",
		"postern_nodewatcher_healthy 1",
		`postern_limiter_active{`,
		`postern_audit_events_total{event="session.start"} 1`,
	} {
		require.Contains(t, body, m)
	}
}
