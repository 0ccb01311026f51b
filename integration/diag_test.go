package integration

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
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

	// pprof is off unless diag_pprof is set (TestDiagPprof).
	code, _ = get("/debug/pprof/goroutine?debug=1")
	require.Equal(t, http.StatusNotFound, code)

	code, body = get("/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, m := range []string{
		"postern_proxy_route_duration_seconds_count 1",
		`postern_backend_request_duration_seconds_count{op="put"}`,
		"postern_nodewatcher_nodes 1",
		"postern_nodewatcher_healthy 1",
		`postern_limiter_active{`,
		`postern_audit_events_total{event="session.start"} 1`,
		// The Go and process collectors: what a session costs.
		"go_goroutines ", "go_memstats_heap_inuse_bytes ", "process_resident_memory_bytes ",
	} {
		require.Contains(t, body, m)
	}
}

// TestDefaultDiagAddrBusy: two node processes on one machine, both with
// the default diagnostics address, run side by side; the one that finds it
// busy starts without diagnostics. An address someone chose stays fatal.
func TestDefaultDiagAddrBusy(t *testing.T) {
	// Hold the default address for the whole test when it is free; when
	// something else holds it, it is busy all the same.
	if ln, err := net.Listen("tcp", config.DefaultDiagAddr); err == nil {
		t.Cleanup(func() { ln.Close() })
	}
	authDir := t.TempDir()
	a := startProcess(t, procConfig(authDir, config.RoleAuth, config.RoleProxy))
	for _, name := range []string{"laptop-1", "laptop-2"} {
		out := mustPctl(t, authDir, "", "tokens", "add", "--type", "node")
		m := joinRe.FindStringSubmatch(out)
		require.NotNil(t, m, out)
		cfg := procConfig(t.TempDir(), config.RoleNode)
		cfg.DiagAddr = "" // the default
		cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = a.Addr(service.ListenerAuth).String(), m[1], m[2], name
		p := startProcess(t, cfg)
		require.NotNil(t, p.Addr(service.ListenerNode))
		require.Nil(t, p.Addr(service.ListenerDiag), "no diagnostics listener on a busy default")
	}
	waitNodes(t, adminClient(t, authDir, a), 2)

	cfg := procConfig(t.TempDir(), config.RoleAuth)
	cfg.DiagAddr = config.DefaultDiagAddr // asked for explicitly
	p, err := service.New(cfg, testOptions())
	require.NoError(t, err)
	err = p.Start(context.Background())
	stopProcess(t, p)
	require.Error(t, err)
	require.Contains(t, err.Error(), config.DefaultDiagAddr)
}

// TestDiagPprof: with diag_pprof the diagnostics port serves pprof, the
// goroutine dump an operator needs to see where sessions' goroutines sit.
func TestDiagPprof(t *testing.T) {
	cfg := procConfig(t.TempDir(), config.RoleAuth)
	cfg.DiagPprof = true
	p := startProcess(t, cfg)
	resp, err := http.Get("http://" + p.Addr(service.ListenerDiag).String() + "/debug/pprof/goroutine?debug=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), "goroutine profile: total")
}

// TestDefaultDiagAddrBusyBinary is TestDefaultDiagAddrBusy through the
// built `postern` binary, where the flags are turned into a config and
// CheckAndSetDefaults runs once in tool/postern and again in service.New:
// the second call must still know that nobody chose the address.
func TestDefaultDiagAddrBusyBinary(t *testing.T) {
	if ln, err := net.Listen("tcp", config.DefaultDiagAddr); err == nil {
		t.Cleanup(func() { ln.Close() })
	}
	authDir := t.TempDir()
	a := startProcess(t, procConfig(authDir, config.RoleAuth, config.RoleProxy))
	for _, name := range []string{"laptop-1", "laptop-2"} {
		m := joinRe.FindStringSubmatch(mustPctl(t, authDir, "", "tokens", "add", "--type", "node"))
		require.NotNil(t, m)
		cmd := exec.Command(bin("postern"), "start", "--data-dir", t.TempDir(), "--roles", "node",
			"--nodename", name, "--auth-server", a.Addr(service.ListenerAuth).String(),
			"--token", m[1], "--ca-pin", m[2], "--node-addr", "127.0.0.1:0") // no --diag-addr
		var stderr syncBuffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-done
		})
		// Up when it heartbeats; an exit before that is the bug.
		clt := adminClient(t, authDir, a)
		var exitErr error
		exited := false
		require.Eventually(t, func() bool {
			select {
			case exitErr = <-done:
				done <- exitErr
				exited = true
				return true
			default:
			}
			nodes, err := clt.GetNodes(context.Background(), "")
			if err != nil {
				return false
			}
			for _, n := range nodes {
				if n.Hostname == name {
					return true
				}
			}
			return false
		}, 30*time.Second, 50*time.Millisecond)
		require.False(t, exited, "postern %s exited: %v\n%s", name, exitErr, stderr.String())
		require.Contains(t, stderr.String(), "default diagnostics address is in use")
	}
}
