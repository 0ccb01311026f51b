package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// requestReceiver is a chat bridge's endpoint for access_requests.webhook
// on 127.0.0.1: it answers the first failFirst deliveries 503 (keeping
// nothing of them), then keeps every JSON line POSTed to it.
type requestReceiver struct {
	mu        sync.Mutex
	failFirst int
	attempts  int
	lines     []map[string]any
	got       chan struct{}
}

func (c *requestReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts++
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-ndjson" {
		http.Error(w, "want a POST of application/x-ndjson", http.StatusUnsupportedMediaType)
		return
	}
	if c.attempts <= c.failFirst {
		http.Error(w, "bridge restarting", http.StatusServiceUnavailable)
		return
	}
	var batch []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		batch = append(batch, m)
	}
	c.lines = append(c.lines, batch...)
	select {
	case c.got <- struct{}{}:
	default:
	}
}

// events returns the event of every line kept so far.
func (c *requestReceiver) events() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, m := range c.lines {
		out = append(out, fmt.Sprint(m["event"]))
	}
	return out
}

// waitEvents waits until the receiver has kept n lines.
func (c *requestReceiver) waitEvents(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for len(c.events()) < n {
		select {
		case <-c.got:
		case <-deadline:
			t.Fatalf("the webhook got %v, want %d lines", c.events(), n)
		}
	}
}

// TestAccessRequestWebhook: `postern start` with access_requests.webhook
// in postern.yaml posts each state change of a request made with psh
// (create, a reviewer's approval, auth's expiry) to a local receiver,
// once each, in order, with the documented fields; the receiver fails the
// first deliveries (it is restarting) and loses nothing.
func TestAccessRequestWebhook(t *testing.T) {
	rcv := &requestReceiver{failFirst: 2, got: make(chan struct{}, 1)}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	d, addrs, _ := algorithmsDaemon(t, fmt.Sprintf("nodename: node-1\naccess_requests:\n  webhook: %s/postern/requests\n", srv.URL))
	d.cmd.Stderr = d.stderr
	require.NoError(t, d.cmd.Start())
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.done
	})
	d.wait(t)

	dir := t.TempDir()
	for i, doc := range strings.Split(requestRoles, "---\n") {
		f := filepath.Join(dir, fmt.Sprintf("role%d.yaml", i))
		require.NoError(t, os.WriteFile(f, []byte(doc), 0o600))
		mustPctl(t, d.dataDir, "", "create", "-f", f)
	}
	c := &allInOne{dataDir: d.dataDir}
	users := map[string]*pshEnv{}
	for name, role := range map[string]string{"rita": "requester", "rev1": "reviewer"} {
		pw := "pw-" + name + "-long-enough\n"
		mustPctl(t, d.dataDir, pw, "users", "add", name, "--logins", name, "--roles", role)
		e := newPshEnv(t, c)
		e.mustRun(t, pw, "login", "--proxy", addrs["web_addr"], "--user", name, "--cacert", filepath.Join(d.dataDir, "web", "web.crt"))
		users[name] = e
	}

	start := time.Now()
	id := strings.TrimSpace(users["rita"].mustRun(t, "", "request", "create", "--roles", "it-access", "--reason", "INC-7", "--ttl", "5s"))
	require.Contains(t, users["rev1"].mustRun(t, "", "request", "approve", "--reason", "go ahead", id), "approved")
	// Expired by auth's sweep, 5 s after the creation; the deliveries
	// the receiver failed are retried meanwhile.
	rcv.waitEvents(t, 3, 60*time.Second)
	require.Contains(t, mustPctl(t, d.dataDir, "", "requests", "show", id), "expired")

	// A clean stop flushes the queue: nothing more was waiting, so each
	// state change arrived exactly once.
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		d.done <- err
		require.NoError(t, err, d.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("postern did not exit after SIGTERM")
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	require.Greater(t, rcv.attempts, rcv.failFirst, "the failed deliveries were retried")
	require.Len(t, rcv.lines, 3, "one line per state change: %v", rcv.lines)

	type want struct{ event, by, state string }
	for i, w := range []want{
		{"access_request.create", "rita", "pending"},
		{"access_request.review", "rev1", "approved"},
		{"access_request.expire", "rita", "expired"},
	} {
		m := rcv.lines[i]
		require.Equal(t, w.event, m["event"], "line %d: %v", i, m)
		require.Equal(t, w.by, m["by"], "line %d", i)
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["time"]))
		require.NoError(t, err, "line %d: time", i)
		require.WithinRange(t, at, start.Add(-time.Minute), time.Now().Add(time.Minute))
		r, ok := m["request"].(map[string]any)
		require.True(t, ok, "line %d: request is an object: %v", i, m)
		require.Equal(t, id, r["id"])
		require.Equal(t, "rita", r["user"])
		require.Equal(t, []any{"it-access"}, r["roles"])
		require.Equal(t, "INC-7", r["reason"])
		require.Equal(t, w.state, r["state"], "line %d", i)
		require.EqualValues(t, 1, r["thresholds"])
		created, err := time.Parse(time.RFC3339Nano, fmt.Sprint(r["created"]))
		require.NoError(t, err)
		expires, err := time.Parse(time.RFC3339Nano, fmt.Sprint(r["expires"]))
		require.NoError(t, err)
		require.Equal(t, 5*time.Second, expires.Sub(created))
		if i > 0 {
			reviews, ok := r["reviews"].([]any)
			require.True(t, ok && len(reviews) == 1, "line %d: reviews %v", i, r["reviews"])
			rv := reviews[0].(map[string]any)
			require.Equal(t, "rev1", rv["reviewer"])
			require.Equal(t, "approved", rv["state"])
			require.Equal(t, "go ahead", rv["reason"])
		} else {
			require.Nil(t, r["reviews"], "a new request has no reviews")
		}
	}
}
