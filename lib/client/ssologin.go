package client

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/nacl/box"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/utils"
)

// Single sign-on for psh (psh login --auth NAME). The user logs in at
// their identity provider in a browser; the proxy sends the browser back
// to a listener psh opens on 127.0.0.1 with the login result (certificate
// and host CAs). That result passes through the browser, its history and
// whatever can read a loopback port, so auth seals it to an X25519 key
// that psh makes for this one login and never writes down: only this psh
// process can open it. The listener takes exactly one result that opens
// and then stops, so a replayed redirect finds nobody.

// DefaultSSOTimeout is how long psh waits for the browser: time for a
// person to type a password and a second factor at their provider, not
// for a login forgotten in a background tab.
const DefaultSSOTimeout = 3 * time.Minute

// SSOCallbackPath is the path of psh's loopback listener.
const SSOCallbackPath = "/callback"

// SSOLoginConfig is one `psh login --auth NAME`.
type SSOLoginConfig struct {
	Web WebConfig
	// Connector names the proxy's single sign-on connector.
	Connector string
	TTL       time.Duration
	Store     *Store
	// Out gets the line with the identity provider's URL.
	Out io.Writer
	// OpenBrowser opens the URL in a browser; nil means the user opens it
	// (psh login --browser none).
	OpenBrowser func(url string) error
	// Timeout bounds the wait for the browser; zero means
	// DefaultSSOTimeout.
	Timeout time.Duration
	// AgentSock, when set, is the ssh-agent that gets the key and
	// certificate.
	AgentSock string
	// Clock times the wait; nil means the real clock.
	Clock clockwork.Clock
	// Now is the clock for the agent lifetime; nil means time.Now.
	Now func() time.Time
}

// WebLoginConnector is the --auth value of a login on the proxy's own web
// login page (psh login --auth web): password, second factors, passkeys,
// or a single sign-on button there, with the certificate coming back
// through the same sealed loopback hand-off as a single sign-on login.
const WebLoginConnector = "web"

// SSOLogin logs in through the proxy's single sign-on connector, or on
// its web login page (WebLoginConnector), and stores the result as Login
// does.
func SSOLogin(ctx context.Context, cfg SSOLoginConfig) (*LoginResult, error) {
	if cfg.Connector == "" {
		return nil, trace.BadParameter("missing --auth NAME")
	}
	start := startSSO
	if cfg.Connector == WebLoginConnector {
		start = startWebLogin
	}
	return browserLogin(ctx, cfg, start)
}

// browserStart asks the proxy to start a login whose result is sealed to
// sealKey and handed to redirect, and returns the URL to open.
type browserStart func(ctx context.Context, cfg SSOLoginConfig, wc *WebClient, ping *webapi.PingResponse, pub []byte, redirect string, sealKey []byte) (string, error)

// startSSO starts a login at the connector's identity provider.
func startSSO(ctx context.Context, cfg SSOLoginConfig, wc *WebClient, ping *webapi.PingResponse, pub []byte, redirect string, sealKey []byte) (string, error) {
	if err := checkConnectorListed(ping, cfg.Connector, wc.Addr()); err != nil {
		return "", trace.Wrap(err)
	}
	authURL, err := wc.SSOConsoleLogin(ctx, webapi.SSOConsoleLoginRequest{
		Connector:   cfg.Connector,
		PubKey:      string(pub),
		TTLSeconds:  int64(cfg.TTL / time.Second),
		RedirectURL: redirect,
		SealKey:     sealKey,
	})
	if err != nil {
		return "", trace.Wrap(err)
	}
	if err := checkBrowserURL(authURL); err != nil {
		return "", trace.BadParameter("proxy %s answered an unusable identity provider URL: %v", wc.Addr(), err)
	}
	return authURL, nil
}

// startWebLogin starts a login on the proxy's web login page. The URL is
// built on the address psh was given (--proxy), the one this user reaches
// the proxy by, with the page's path the proxy answered.
func startWebLogin(ctx context.Context, cfg SSOLoginConfig, wc *WebClient, _ *webapi.PingResponse, pub []byte, redirect string, sealKey []byte) (string, error) {
	path, err := wc.WebConsoleLogin(ctx, webapi.WebConsoleLoginRequest{
		PubKey:      string(pub),
		TTLSeconds:  int64(cfg.TTL / time.Second),
		RedirectURL: redirect,
		SealKey:     sealKey,
	})
	if err != nil {
		return "", trace.Wrap(err)
	}
	if !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") {
		return "", trace.BadParameter("proxy %s answered an unusable login page path %q", wc.Addr(), path)
	}
	loginURL := "https://" + wc.Addr() + path
	if err := checkBrowserURL(loginURL); err != nil {
		return "", trace.BadParameter("proxy %s answered an unusable login page path: %v", wc.Addr(), err)
	}
	return loginURL, nil
}

// browserLogin is every login psh does in a browser: a fresh key pair,
// the loopback listener with its seal key, start's URL printed (and
// opened), and the one sealed result that comes back, stored as Login
// stores its result.
func browserLogin(ctx context.Context, cfg SSOLoginConfig, start browserStart) (*LoginResult, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultSSOTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	wc, err := NewWebClient(cfg.Web)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer wc.Close()
	ping, err := wc.Ping(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	priv, pub, err := utils.GenerateKeyPair()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	h, err := NewSSOHandoff()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	redirect, stop, err := h.Listen("127.0.0.1:0")
	if err != nil {
		return nil, trace.Wrap(err)
	}
	defer stop()
	loginURL, err := start(ctx, cfg, wc, ping, pub, redirect, h.SealKey())
	if err != nil {
		return nil, trace.Wrap(err)
	}
	fmt.Fprintf(cfg.Out, "If the browser does not open, visit: %s\n", loginURL)
	if cfg.OpenBrowser != nil {
		if err := cfg.OpenBrowser(loginURL); err != nil {
			fmt.Fprintf(cfg.Out, "Could not open a browser (%v); open the URL above yourself.\n", err)
		}
	}
	resp, err := h.Wait(ctx, cfg.Clock, cfg.Timeout)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return saveLogin(loginSave{
		wc: wc, ping: ping, priv: priv, pub: pub, store: cfg.Store, agentSock: cfg.AgentSock, now: cfg.Now,
		resp: &webapi.SSHLoginResponse{Username: resp.Username, Cert: strings.TrimSpace(string(resp.Cert)), HostSigners: resp.HostSigners},
	})
}

// checkConnectorListed refuses a connector the proxy does not list, with
// the names it does: a typo is told at once, not after a browser round
// trip. A proxy that lists none (an older one, or auth did not answer
// its ping in time) is asked anyway, and says itself.
func checkConnectorListed(ping *webapi.PingResponse, name, proxy string) error {
	if len(ping.Connectors) == 0 {
		return nil
	}
	var names []string
	for _, c := range ping.Connectors {
		if c.Name == name {
			return nil
		}
		names = append(names, c.Name)
	}
	slices.Sort(names)
	return trace.NotFound("proxy %s has no single sign-on connector %q (it has: %s)", proxy, name, strings.Join(names, ", "))
}

// checkBrowserURL accepts an http(s) URL without control characters:
// psh prints it to the terminal and hands it to a browser opener.
func checkBrowserURL(raw string) error {
	if strings.ContainsFunc(raw, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return trace.BadParameter("it holds control characters")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return trace.BadParameter("%q is not an http(s) URL", raw)
	}
	return nil
}

// OpenBrowser opens url in the desktop's browser: xdg-open, or open on
// macOS. It returns once the opener started; the browser may still fail
// to appear, which is why psh prints the URL first.
func OpenBrowser(url string) error {
	opener := "xdg-open"
	if runtime.GOOS == "darwin" {
		opener = "open"
	}
	cmd := exec.Command(opener, url)
	if err := cmd.Start(); err != nil {
		return trace.Wrap(err)
	}
	go func() { _ = cmd.Wait() }() // reap it; psh does not care how it ends
	return nil
}

// SSOHandoff is psh's side of the hand-off: the ephemeral seal key and the
// loopback listener that takes the sealed result.
type SSOHandoff struct {
	pub, priv *[32]byte
	result    chan *authapi.SSHLoginResponse

	// mu guards done and refused.
	mu   sync.Mutex
	done bool
	// refused counts results that did not open with this key.
	refused int
}

// NewSSOHandoff makes a hand-off with a fresh X25519 key pair.
func NewSSOHandoff() (*SSOHandoff, error) {
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &SSOHandoff{pub: pub, priv: priv, result: make(chan *authapi.SSHLoginResponse, 1)}, nil
}

// SealKey is the public key auth seals the result to.
func (h *SSOHandoff) SealKey() []byte { return h.pub[:] }

// Timeouts of the loopback listener's HTTP server: only a browser on this
// machine talks to it, quickly.
const handoffHeaderTimeout = 10 * time.Second

// handoffShutdownGrace bounds how long stopping the listener waits for a
// page being written to the browser.
const handoffShutdownGrace = 2 * time.Second

// Listen serves the hand-off on addr (127.0.0.1:0) and returns the
// redirect URL to give the proxy and a stop function that closes the
// listener and waits for its goroutine.
func (h *SSOHandoff) Listen(addr string) (redirect string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, trace.ConnectionProblem(err, "cannot listen on %s for the browser's return: %v", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: handoffHeaderTimeout}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			// Let a handler that is answering finish its page; then
			// close whatever is left.
			ctx, cancel := context.WithTimeout(context.Background(), handoffShutdownGrace)
			defer cancel()
			_ = srv.Shutdown(ctx)
			_ = srv.Close()
			<-done
		})
	}
	return "http://" + ln.Addr().String() + SSOCallbackPath, stop, nil
}

// Pages psh answers the browser with.
const (
	handoffDonePage    = "<!doctype html><meta charset=utf-8><title>Postern</title><h1>Logged in, you can close this tab</h1><p>psh has your certificate.</p>\n"
	handoffRefusedPage = "<!doctype html><meta charset=utf-8><title>Postern</title><h1>Login refused</h1><p>This login result is not for this psh: it was sealed to another psh's key. Finish the login that this psh started.</p>\n"
	handoffUsedPage    = "<!doctype html><meta charset=utf-8><title>Postern</title><h1>Already logged in</h1><p>This psh has already taken its login result; it takes only one.</p>\n"
	handoffBadPage     = "<!doctype html><meta charset=utf-8><title>Postern</title><h1>Not a login result</h1><p>This address is where the Postern proxy sends your browser back to psh.</p>\n"
)

// ServeHTTP takes GET /callback?response=BASE64URL(sealed result).
func (h *SSOHandoff) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if r.Method != http.MethodGet || r.URL.Path != SSOCallbackPath {
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, handoffBadPage)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		w.WriteHeader(http.StatusGone)
		_, _ = io.WriteString(w, handoffUsedPage)
		return
	}
	sealed, err := base64.RawURLEncoding.DecodeString(r.URL.Query().Get("response"))
	if err != nil || len(sealed) == 0 {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, handoffBadPage)
		return
	}
	opened, ok := box.OpenAnonymous(nil, sealed, h.pub, h.priv)
	if !ok {
		h.refused++
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, handoffRefusedPage)
		return
	}
	var resp authapi.SSHLoginResponse
	if err := json.Unmarshal(opened, &resp); err != nil || len(resp.Cert) == 0 {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, handoffBadPage)
		return
	}
	h.done = true
	// The page goes out before psh learns the result: psh stops this
	// server as soon as it has it, and a browser whose answer was cut
	// off shows an error (Chromium even retries, into a closed port)
	// although the login worked.
	_, _ = io.WriteString(w, handoffDonePage)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	h.result <- &resp
}

// Wait returns the one result that opened, or an error when ctx ends or
// timeout passes first.
func (h *SSOHandoff) Wait(ctx context.Context, clock clockwork.Clock, timeout time.Duration) (*authapi.SSHLoginResponse, error) {
	timer := clock.NewTimer(timeout)
	defer timer.Stop()
	select {
	case resp := <-h.result:
		return resp, nil
	case <-ctx.Done():
		return nil, trace.Wrap(ctx.Err(), "waiting for the browser to finish the login")
	case <-timer.Chan():
	}
	h.mu.Lock()
	refused := h.refused
	h.mu.Unlock()
	msg := fmt.Sprintf("no login came back from the browser within %s: finish the login in the browser sooner, or run psh login again", timeout)
	if refused > 0 {
		msg += fmt.Sprintf(" (%d login result(s) not for this psh were refused)", refused)
	}
	return nil, trace.LimitExceeded("%s", msg)
}
