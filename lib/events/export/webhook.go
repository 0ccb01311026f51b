package export

// The webhook exporter: batches of JSON lines POSTed to audit.webhook
// (Content-Type application/x-ndjson), the shape SIEM HTTP collectors
// (Splunk HEC raw, Elastic, Vector's http source, Loki via a gateway)
// take.
//
// A batch is retried with exponential backoff (jittered, so that a fleet
// does not return in lock step) while the webhook fails in a way that can
// pass: a network error, a timeout, 5xx, 408 and 429. Any other answer
// outside 2xx (a 400 for a body it cannot parse, a 401 for a wrong
// token, a redirect) is a permanent refusal of that batch: retrying would
// refuse it again and stall every later event behind it, so it is
// logged, counted as dropped and the next batch goes. Redirects are not
// followed: audit records go to the URL the operator configured, not to
// one a server names.
//
// While a batch is retried the events behind it wait in the queue; once
// it is full they are dropped and counted (export.go says why the newest).

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/backoff"
)

// Webhook posts events to a URL. Safe for concurrent use.
type Webhook struct {
	*queue
	url     string
	client  *http.Client
	clock   clockwork.Clock
	timeout time.Duration
	retry   backoff.Backoff
	// failing is true from a failed attempt to the next success: one
	// log line per outage. The goroutine's only.
	failing bool
	// onWait, in tests, is called when a retry's timer is set.
	onWait func()
}

// CheckURL validates a webhook URL: https, or http to a loopback address
// only (a collector beside the process): audit records name users,
// addresses and commands, and must not cross a network in clear.
func CheckURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, trace.BadParameter("%q: want https://HOST[:PORT]/PATH", raw)
	}
	if u.Scheme == "http" {
		host := u.Hostname()
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, trace.BadParameter("%q: plain http is only for a collector on loopback; use https", raw)
		}
	}
	return u, nil
}

// NewWebhook starts posting to cfg.Webhook.
func NewWebhook(cfg Config) (*Webhook, error) {
	w, err := newWebhook(cfg)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	w.start()
	return w, nil
}

func newWebhook(cfg Config) (*Webhook, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	if _, err := CheckURL(cfg.Webhook); err != nil {
		return nil, trace.BadParameter("audit.webhook %v", err)
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12} // RootCAs nil: the system's
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, trace.BadParameter("audit.ca_file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, trace.BadParameter("audit.ca_file %s: no PEM certificate in it", cfg.CAFile)
		}
		tlsConfig.RootCAs = pool
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsConfig
	transport.Proxy = nil // a collector is the operator's own, not behind HTTP_PROXY
	w := &Webhook{
		url: cfg.Webhook,
		client: &http.Client{
			Transport: transport,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
		clock:   cfg.Clock,
		timeout: cfg.Timeout,
		retry:   backoff.Backoff{Min: cfg.RetryMin, Max: cfg.RetryMax, Jitter: true},
	}
	var err error
	if w.queue, err = newQueue(&cfg, SinkWebhook, w.deliver); err != nil {
		return nil, trace.Wrap(err)
	}
	w.log = w.log.WithField("url", redact(cfg.Webhook))
	return w, nil
}

// Close delivers what is queued until ctx is done (export.go), then
// closes the idle connections to the webhook.
func (w *Webhook) Close(ctx context.Context) error {
	err := w.queue.Close(ctx)
	w.client.CloseIdleConnections()
	return trace.Wrap(err)
}

// redact drops the URL's user info and query (a token is often there)
// from what is logged.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	u.User, u.RawQuery = nil, ""
	return u.String()
}

// deliver posts one batch until it is taken, refused for good, or ctx
// (Close's time) is done; it returns how many events it dropped.
func (w *Webhook) deliver(ctx context.Context, batch [][]byte) int {
	body := joinLines(batch)
	w.retry.Reset()
	for {
		err := w.post(ctx, body)
		switch {
		case err == nil:
			if w.failing {
				w.failing = false
				w.log.Info("The audit webhook takes events again.")
			}
			return 0
		case trace.IsBadParameter(err):
			w.log.WithError(err).WithField("events", len(batch)).Error("The audit webhook refused a batch of events; dropped it.")
			return len(batch)
		case ctx.Err() != nil:
			w.log.WithError(err).WithField("events", len(batch)).Warn("Shutting down: abandoned audit events the webhook had not taken.")
			return len(batch)
		}
		if !w.failing {
			w.failing = true
			w.log.WithError(err).Warn("Cannot deliver audit events to the webhook; will keep trying.")
		}
		timer := w.clock.NewTimer(w.retry.Next())
		if w.onWait != nil {
			w.onWait()
		}
		select {
		case <-timer.Chan():
		case <-ctx.Done():
			timer.Stop()
			w.log.WithField("events", len(batch)).Warn("Shutting down: abandoned audit events the webhook had not taken.")
			return len(batch)
		}
	}
}

// post makes one attempt. A BadParameter is a permanent refusal; any
// other error may pass.
func (w *Webhook) post(ctx context.Context, body []byte) error {
	ctx, cancel := clockwork.WithTimeout(ctx, w.clock, w.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return trace.BadParameter("%v", err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := w.client.Do(req)
	if err != nil {
		return trace.ConnectionProblem(err, "posting audit events: %v", err)
	}
	defer resp.Body.Close()
	// Read a little of the answer for the log and the rest away, so that
	// the connection is reused.
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	status := fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500:
		return trace.ConnectionProblem(nil, "the audit webhook answered %s", status)
	case c >= 300 && c < 400:
		return trace.BadParameter("the audit webhook redirected to %q (%s): configure the final URL", resp.Header.Get("Location"), resp.Status)
	default:
		return trace.BadParameter("the audit webhook answered %s", status)
	}
}
