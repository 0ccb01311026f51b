package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// auditCollector is a SIEM's HTTP collector on 127.0.0.1: it keeps the
// JSON lines POSTed to it and signals each request.
type auditCollector struct {
	mu    sync.Mutex
	lines []map[string]any
	got   chan struct{}
}

func (c *auditCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.Header.Get("Content-Type") != "application/x-ndjson" {
		http.Error(w, "want application/x-ndjson", http.StatusUnsupportedMediaType)
		return
	}
	c.mu.Lock()
	for _, l := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			c.mu.Unlock()
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.lines = append(c.lines, m)
	}
	c.mu.Unlock()
	select {
	case c.got <- struct{}{}:
	default:
	}
}

// sessionEvents returns the events of type session.start and
// session.end among lines, by session_id.
func sessionEvents(lines []map[string]any) map[string][]string {
	out := map[string][]string{}
	for _, m := range lines {
		if t, _ := m["event"].(string); t == "session.start" || t == "session.end" {
			id, _ := m["session_id"].(string)
			out[id] = append(out[id], t)
		}
	}
	return out
}

// fileLines reads the export file's JSON lines.
// rotatedLines reads an export file rotated by size: path.N (the oldest)
// down to path.1, then path.
func rotatedLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	n := 0
	for {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", path, n+1)); err != nil {
			break
		}
		n++
	}
	var out []map[string]any
	for i := n; i >= 1; i-- {
		out = append(out, fileLines(t, fmt.Sprintf("%s.%d", path, i))...)
	}
	return append(out, fileLines(t, path)...)
}

func fileLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		out = append(out, m)
	}
	return out
}

// TestAuditExportFromConfigFile: `postern start --config` with an audit:
// section sends the events of an SSH session through it to a webhook and
// to a file, as well as to events.log.
func TestAuditExportFromConfigFile(t *testing.T) {
	col := &auditCollector{got: make(chan struct{}, 1)}
	srv := httptest.NewServer(col)
	t.Cleanup(srv.Close)
	exportFile := filepath.Join(t.TempDir(), "audit.jsonl")
	// The file rotates itself every kilobyte or so and keeps every piece:
	// the pieces read in order must hold every line once.
	d, addrs, _ := algorithmsDaemon(t, fmt.Sprintf("nodename: node-1\naudit:\n  file: %s\n  format: json\n  webhook: %s/ingest\n  max_size_bytes: 1024\n  max_files: 1000\n", exportFile, srv.URL))
	d.cmd.Stderr = d.stderr
	require.NoError(t, d.cmd.Start())
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.done
	})
	d.wait(t)

	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, d.dataDir, "correct horse battery\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, d.dataDir, "", "auth", "sign", "--user", "alice", "--ttl", "10m", "--out", keyPath)
	c := &allInOne{dataDir: d.dataDir, login: u.Username, hostname: "node-1", keyPath: keyPath}
	cfg := c.clientConfig(t)
	proxy, err := ssh.Dial("tcp", addrs["ssh_addr"], cfg)
	require.NoError(t, err)
	defer proxy.Close()
	// The node registers once its role is up, after auth answers.
	var conn net.Conn
	require.Eventually(t, func() bool {
		conn, err = proxy.Dial("tcp", "node-1:0")
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)
	sconn, chans, reqs, err := ssh.NewClientConn(conn, "node-1:0", cfg)
	require.NoError(t, err)
	node := ssh.NewClient(sconn, chans, reqs)
	out, err := run(t, node, "echo exported")
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(out, "exported\n"), out)
	node.Close()

	// The webhook gets the session's start and end.
	deadline := time.After(30 * time.Second)
	var sid string
	for sid == "" {
		select {
		case <-col.got:
		case <-deadline:
			t.Fatalf("no session.start and session.end at the webhook; got %v", col.lines)
		}
		col.mu.Lock()
		for id, types := range sessionEvents(col.lines) {
			if len(types) == 2 && id != "" {
				require.Equal(t, []string{"session.start", "session.end"}, types)
				sid = id
			}
		}
		col.mu.Unlock()
	}
	// So does the file, written by another goroutine of the daemon.
	require.Eventually(t, func() bool {
		return len(sessionEvents(rotatedLines(t, exportFile))[sid]) == 2
	}, 10*time.Second, 50*time.Millisecond)
	st, err := os.Stat(exportFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	require.Equal(t, []string{"session.start", "session.end"}, sessionEvents(rotatedLines(t, exportFile))[sid])

	// Both hold the lines of events.log, and the daemon still stops
	// cleanly with exporters running.
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		d.done <- err
		require.NoError(t, err, d.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("postern did not exit after SIGTERM")
	}
	logged := fileLines(t, filepath.Join(d.dataDir, "log", "events.log"))
	exported := rotatedLines(t, exportFile)
	require.Equal(t, logged, exported, "the export file is a copy of what this process emitted")
	require.FileExists(t, exportFile+".1", "audit.max_size_bytes rotated the file")
	col.mu.Lock()
	defer col.mu.Unlock()
	require.Equal(t, logged, col.lines, "every event reached the webhook, once, in order")
}
