package export

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// collector is a webhook on 127.0.0.1: it answers each request with the
// next of its scripted statuses (then 200), or hangs while hang is set,
// and keeps the lines of the requests it took (2xx), in order.
type collector struct {
	*httptest.Server
	mu       sync.Mutex
	statuses []int
	hang     bool
	lines    []string
	types    []string
	// got is signalled for every request, once it is answered or hangs.
	got chan int
}

func newCollector(t *testing.T, statuses ...int) *collector {
	c := &collector{statuses: statuses, got: make(chan int, 100)}
	c.Server = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	if c.hang {
		c.mu.Unlock()
		c.got <- 0
		<-r.Context().Done() // the client gave up
		return
	}
	status := http.StatusOK
	if len(c.statuses) > 0 {
		status, c.statuses = c.statuses[0], c.statuses[1:]
	}
	if status == http.StatusOK {
		c.lines = append(c.lines, strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")...)
		c.types = append(c.types, r.Header.Get("Content-Type"))
	}
	c.mu.Unlock()
	w.WriteHeader(status)
	c.got <- status
}

func (c *collector) setHang(v bool) {
	c.mu.Lock()
	c.hang = v
	c.mu.Unlock()
}

func (c *collector) taken() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// testWebhook is a Webhook on a fake clock whose retry waits are signalled
// on waiting.
func testWebhook(t *testing.T, url string, queue, batch int) (*Webhook, *clockwork.FakeClock, chan struct{}, *prometheus.Registry) {
	clock := clockwork.NewFakeClock()
	reg := prometheus.NewRegistry()
	w, err := newWebhook(Config{
		Webhook: url, QueueSize: queue, BatchSize: batch, Deps: observe.Deps{Clock: clock, Metrics: reg},
		Timeout: 10 * time.Second, RetryMin: time.Second, RetryMax: 4 * time.Second,
	})
	require.NoError(t, err)
	waiting := make(chan struct{}, 100)
	w.onWait = func() { waiting <- struct{}{} }
	w.start()
	t.Cleanup(func() { require.NoError(t, w.Close(context.Background())) })
	return w, clock, waiting, reg
}

func lines(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf(`{"event":"session.start","n":%d}`, i))
	}
	return out
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
}

func flush(t *testing.T, q interface{ Flush(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, q.Flush(ctx))
}

// TestWebhookRetriesUntilTaken: a webhook that answers 503, 429 and 408
// gets each batch again after a backoff, and in the end every event
// arrives once, in order, as JSON lines.
func TestWebhookRetriesUntilTaken(t *testing.T) {
	c := newCollector(t, http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusRequestTimeout)
	w, clock, waiting, reg := testWebhook(t, c.URL, 100, 2)
	want := lines(0, 7)
	for _, l := range want {
		w.Export([]byte(l))
	}
	for range 3 {
		recv(t, waiting)
		clock.Advance(4 * time.Second)
	}
	flush(t, w)
	require.Equal(t, want, c.taken())
	for _, ct := range c.types {
		require.Equal(t, "application/x-ndjson", ct)
	}
	require.Zero(t, testutil.ToFloat64(w.m.dropped))
	require.Zero(t, testutil.ToFloat64(w.m.length))
	n, err := testutil.GatherAndCount(reg, "postern_audit_queue_length", "postern_audit_dropped_total")
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

// TestWebhookHangs: while the webhook hangs, Export still returns at
// once; the queue fills, and what does not fit is dropped and counted. A
// request that times out is retried, and once the webhook answers again
// what was queued arrives.
func TestWebhookHangs(t *testing.T) {
	c := newCollector(t)
	c.setHang(true)
	w, clock, waiting, _ := testWebhook(t, c.URL, 4, 1)
	all := lines(0, 8)
	w.Export([]byte(all[0]))
	recv(t, c.got) // all[0] is in flight, hanging
	done := make(chan struct{})
	go func() {
		for _, l := range all[1:] {
			w.Export([]byte(l)) // 4 fit in the queue, 3 do not
		}
		close(done)
	}()
	recv(t, done) // Export did not wait for the webhook
	require.Equal(t, 3.0, testutil.ToFloat64(w.m.dropped))
	require.Equal(t, 5.0, testutil.ToFloat64(w.m.length))

	c.setHang(false)
	clock.Advance(10 * time.Second) // the request times out
	recv(t, waiting)
	clock.Advance(4 * time.Second)
	flush(t, w)
	require.Equal(t, all[:5], c.taken())
	require.Zero(t, testutil.ToFloat64(w.m.length))
}

// TestWebhookRefuses: a 4xx other than 408 and 429 refuses the batch for
// good: it is dropped and counted, and the next batch goes.
func TestWebhookRefuses(t *testing.T) {
	c := newCollector(t, http.StatusBadRequest)
	w, _, _, _ := testWebhook(t, c.URL, 10, 10)
	w.Export([]byte(lines(0, 1)[0]))
	flush(t, w)
	require.Equal(t, http.StatusBadRequest, recv(t, c.got))
	w.Export([]byte(lines(1, 2)[0]))
	flush(t, w)
	require.Equal(t, lines(1, 2), c.taken())
	require.Equal(t, 1.0, testutil.ToFloat64(w.m.dropped))
}

// TestWebhookClose: Close delivers what is queued; when its time is up
// (the webhook hangs), it abandons the rest, counted as dropped, and
// returns.
func TestWebhookClose(t *testing.T) {
	c := newCollector(t)
	w, err := NewWebhook(Config{Webhook: c.URL, Deps: observe.Deps{Metrics: prometheus.NewRegistry()}})
	require.NoError(t, err)
	for _, l := range lines(0, 3) {
		w.Export([]byte(l))
	}
	require.NoError(t, w.Close(context.Background()))
	require.Equal(t, lines(0, 3), c.taken())
	w.Export([]byte("{}")) // after Close: counted, not queued
	require.Equal(t, 1.0, testutil.ToFloat64(w.m.dropped))

	h := newCollector(t)
	h.setHang(true)
	w, err = NewWebhook(Config{Webhook: h.URL, Deps: observe.Deps{Metrics: prometheus.NewRegistry()}})
	require.NoError(t, err)
	for _, l := range lines(0, 3) {
		w.Export([]byte(l))
	}
	recv(t, h.got)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the grace is over
	require.NoError(t, w.Close(ctx))
	require.Equal(t, 3.0, testutil.ToFloat64(w.m.dropped))
	require.Zero(t, testutil.ToFloat64(w.m.length))
}

// TestWebhookURL: plain http only to loopback.
func TestWebhookURL(t *testing.T) {
	for _, ok := range []string{"https://siem.example.com/in", "http://127.0.0.1:8080/x", "http://localhost/x", "http://[::1]:9/"} {
		_, err := CheckURL(ok)
		require.NoError(t, err, ok)
	}
	for bad, want := range map[string]string{
		"http://siem.example.com/in": "plain http",
		"ftp://h/x":                  "want https://",
		"siem.example.com":           "want https://",
	} {
		_, err := CheckURL(bad)
		require.ErrorContains(t, err, want, bad)
	}
	require.Equal(t, "https://h/p", redact("https://user:secret@h/p?token=x"))
}

// TestWebhookCAFile: with ca_file, the webhook's certificate is checked
// against it (an httptest TLS server's own CA), not the system's roots;
// a file without a certificate is refused at start, naming the key.
func TestWebhookCAFile(t *testing.T) {
	c := &collector{got: make(chan int, 100)}
	c.Server = httptest.NewTLSServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.Close)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate().Raw}), 0o600))

	w, err := NewWebhook(Config{Webhook: c.URL, CAFile: caFile, Deps: observe.Deps{Metrics: prometheus.NewRegistry()}})
	require.NoError(t, err)
	w.Export([]byte(lines(0, 1)[0]))
	require.NoError(t, w.Close(context.Background()))
	require.Equal(t, lines(0, 1), c.taken())

	empty := filepath.Join(dir, "empty.pem")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, err = NewWebhook(Config{Webhook: c.URL, CAFile: empty})
	require.ErrorContains(t, err, "audit.ca_file")
	_, err = NewWebhook(Config{Webhook: c.URL, CAFile: filepath.Join(dir, "missing.pem")})
	require.ErrorContains(t, err, "audit.ca_file")
}
