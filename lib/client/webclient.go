package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/webapi"
)

// WebConfig configures the client of the proxy's web API.
type WebConfig struct {
	// Proxy is the web address HOST[:PORT]; the port defaults to 3080.
	Proxy string
	// Insecure skips TLS verification (the caller warns the user).
	Insecure bool
	// CACertFile, when set, is a PEM bundle trusted instead of the system
	// roots (a self-signed proxy certificate).
	CACertFile string
	// Timeout bounds each call; zero means DefaultWebTimeout.
	Timeout time.Duration
}

// DefaultWebPort is the proxy's HTTPS port (docs/reference.md, Ports).
const DefaultWebPort = "3080"

// DefaultWebTimeout bounds one call: a login on a loaded proxy pays for a
// bcrypt comparison, but a proxy that does not answer in this long is down.
const DefaultWebTimeout = 30 * time.Second

// maxResponse bounds what psh reads from a proxy (or from a server that
// is not one): a ping or a certificate is a few KiB.
const maxResponse = 1 << 20

// WebClient calls /webapi.
type WebClient struct {
	cfg       WebConfig
	base      string
	transport *http.Transport
	http      *http.Client
}

// NormalizeProxyAddr adds the default web port to a bare host.
func NormalizeProxyAddr(addr string) (string, error) {
	if addr == "" {
		return "", trace.BadParameter("missing --proxy HOST[:PORT]")
	}
	if strings.Contains(addr, "://") || strings.ContainsAny(addr, "/ ") {
		return "", trace.BadParameter("invalid proxy address %q: want HOST[:PORT]", addr)
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr, nil
	}
	return net.JoinHostPort(strings.Trim(addr, "[]"), DefaultWebPort), nil
}

// NewWebClient makes a client; it does not dial until the first call.
func NewWebClient(cfg WebConfig) (*WebClient, error) {
	addr, err := NormalizeProxyAddr(cfg.Proxy)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cfg.Proxy = addr
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultWebTimeout
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.Insecure}
	if cfg.CACertFile != "" {
		pem, err := os.ReadFile(cfg.CACertFile)
		if err != nil {
			return nil, trace.BadParameter("--cacert: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, trace.BadParameter("--cacert %s: no PEM certificate in it", cfg.CACertFile)
		}
		tlsCfg.RootCAs = pool
	}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: cfg.Timeout,
	}
	return &WebClient{cfg: cfg, base: "https://" + addr, transport: transport, http: &http.Client{Transport: transport, Timeout: cfg.Timeout}}, nil
}

// Addr is the normalized proxy web address.
func (c *WebClient) Addr() string { return c.cfg.Proxy }

// Close drops idle connections.
func (c *WebClient) Close() { c.transport.CloseIdleConnections() }

// Ping asks the proxy who it is. A server that answers but is not a
// Postern proxy is a clear error, not a JSON decoding message.
func (c *WebClient) Ping(ctx context.Context) (*webapi.PingResponse, error) {
	var ping webapi.PingResponse
	code, body, err := c.call(ctx, http.MethodGet, "/webapi/ping", nil)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if code != http.StatusOK || json.Unmarshal(body, &ping) != nil || ping.ClusterName == "" || ping.ProxySSHAddr == "" {
		return nil, c.notPostern(fmt.Sprintf("GET /webapi/ping answered %d", code))
	}
	return &ping, nil
}

func (c *WebClient) notPostern(why string) error {
	return trace.BadParameter("%s is not a Postern proxy (%s): check --proxy", c.cfg.Proxy, why)
}

// SSHLogin posts a login and returns the certificate.
func (c *WebClient) SSHLogin(ctx context.Context, req webapi.SSHLoginRequest) (*webapi.SSHLoginResponse, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	code, body, err := c.call(ctx, http.MethodPost, "/webapi/ssh/certs", data)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if code != http.StatusOK {
		var e webapi.ErrorResponse
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			return nil, c.notPostern(fmt.Sprintf("POST /webapi/ssh/certs answered %d", code))
		}
		switch code {
		case http.StatusUnauthorized:
			return nil, trace.AccessDenied("login failed: %s", e.Error)
		case http.StatusForbidden:
			// A locked user (who gave the right password): the proxy's
			// text says so and why.
			return nil, trace.AccessDenied("login refused: %s", e.Error)
		case http.StatusTooManyRequests:
			return nil, trace.LimitExceeded("login refused: %s", e.Error)
		case http.StatusBadRequest:
			return nil, trace.BadParameter("login refused: %s", e.Error)
		case http.StatusServiceUnavailable:
			// The proxy is fine; auth (or its backend) is not: say that,
			// not a status code.
			return nil, trace.ConnectionProblem(nil, "login failed: %s", e.Error)
		default:
			return nil, trace.ConnectionProblem(nil, "login failed: proxy %s answered %d: %s", c.cfg.Proxy, code, e.Error)
		}
	}
	var resp webapi.SSHLoginResponse
	if err := json.Unmarshal(body, &resp); err != nil || resp.Cert == "" {
		return nil, c.notPostern("POST /webapi/ssh/certs answered without a certificate")
	}
	return &resp, nil
}

// SSOConsoleLogin starts a single sign-on login for psh and returns the
// identity provider's URL to open in the browser.
func (c *WebClient) SSOConsoleLogin(ctx context.Context, req webapi.SSOConsoleLoginRequest) (string, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return "", trace.Wrap(err)
	}
	const path = "/webapi/oidc/login/console"
	code, body, err := c.call(ctx, http.MethodPost, path, data)
	if err != nil {
		return "", trace.Wrap(err)
	}
	if code != http.StatusOK {
		var e webapi.ErrorResponse
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			return "", c.notPostern(fmt.Sprintf("POST %s answered %d", path, code))
		}
		switch code {
		case http.StatusNotFound:
			return "", trace.NotFound("single sign-on refused: %s", e.Error)
		case http.StatusBadRequest, http.StatusForbidden:
			return "", trace.BadParameter("single sign-on refused: %s", e.Error)
		case http.StatusTooManyRequests:
			return "", trace.LimitExceeded("single sign-on refused: %s", e.Error)
		case http.StatusNotImplemented:
			return "", trace.NotImplemented("single sign-on is not available on proxy %s: %s", c.cfg.Proxy, e.Error)
		case http.StatusServiceUnavailable:
			return "", trace.ConnectionProblem(nil, "single sign-on failed: %s", e.Error)
		default:
			return "", trace.ConnectionProblem(nil, "single sign-on failed: proxy %s answered %d: %s", c.cfg.Proxy, code, e.Error)
		}
	}
	var resp webapi.SSOConsoleLoginResponse
	if err := json.Unmarshal(body, &resp); err != nil || resp.AuthURL == "" {
		return "", c.notPostern("POST " + path + " answered without an authorization URL")
	}
	return resp.AuthURL, nil
}

// WebConsoleLogin starts psh login --auth web: it answers the path of the
// proxy's login page for this login.
func (c *WebClient) WebConsoleLogin(ctx context.Context, req webapi.WebConsoleLoginRequest) (string, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return "", trace.Wrap(err)
	}
	const path = "/webapi/login/console"
	code, body, err := c.call(ctx, http.MethodPost, path, data)
	if err != nil {
		return "", trace.Wrap(err)
	}
	if code != http.StatusOK {
		var e webapi.ErrorResponse
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			return "", c.notPostern(fmt.Sprintf("POST %s answered %d", path, code))
		}
		switch code {
		case http.StatusBadRequest, http.StatusForbidden:
			return "", trace.BadParameter("web login refused: %s", e.Error)
		case http.StatusNotFound, http.StatusNotImplemented:
			return "", trace.NotImplemented("psh login --auth web is not available on proxy %s: %s", c.cfg.Proxy, e.Error)
		case http.StatusServiceUnavailable:
			return "", trace.ConnectionProblem(nil, "web login failed: %s", e.Error)
		}
		return "", trace.Errorf("web login failed: %s", e.Error)
	}
	var resp webapi.WebConsoleLoginResponse
	if err := json.Unmarshal(body, &resp); err != nil || resp.Path == "" {
		return "", c.notPostern("POST " + path + " answered no login page")
	}
	return resp.Path, nil
}

// call does one request and returns the status and (bounded) body. TLS
// failures get a message that says what to do about them.
func (c *WebClient) call(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, trace.Wrap(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, c.dialError(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return 0, nil, trace.ConnectionProblem(err, "reading the answer of %s: %v", c.cfg.Proxy, err)
	}
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != "application/json" {
		return 0, nil, c.notPostern(fmt.Sprintf("%s %s answered %d with %q, not JSON", method, path, resp.StatusCode, ct))
	}
	return resp.StatusCode, data, nil
}

func (c *WebClient) dialError(err error) error {
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var certErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	switch {
	case errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &certErr):
		return trace.AccessDenied("the TLS certificate of %s does not verify (%v): pass --cacert FILE with its CA, or --insecure to skip verification", c.cfg.Proxy, tlsReason(err))
	case errors.As(err, &recordErr):
		return c.notPostern("it does not speak HTTPS")
	}
	return trace.ConnectionProblem(err, "cannot reach proxy %s: %v", c.cfg.Proxy, rootCause(err))
}

func tlsReason(err error) string {
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return oneLine(certErr.Err)
	}
	return oneLine(rootCause(err))
}

// rootCause unwraps url.Error and friends down to the innermost error.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
