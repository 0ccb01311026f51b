package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/web"
)

// echoRounds is how many single keystrokes each op times for the echo
// latency: enough to average out scheduler noise, few enough that an op
// stays well under a second once the shell is up.
const echoRounds = 20

// webClient is a logged-in browser: HTTPS client, cookie and token.
type webClient struct {
	addr   string
	hc     *http.Client
	cookie string
	token  string
}

func webLogin(c *cluster) (*webClient, error) {
	caPEM, err := os.ReadFile(filepath.Join(c.dir, "web", web.SelfSignedCertFile))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	addr := c.p.Addr(service.ListenerWeb).String()
	resp, err := hc.Post("https://"+addr+"/webapi/sessions", "application/json",
		strings.NewReader(`{"user":"bench","password":"correct horse battery","otp_token":""}`))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("web login: %s: %s", resp.Status, body)
	}
	var out webapi.CreateSessionResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	w := &webClient{addr: addr, hc: hc, token: out.Token}
	for _, ck := range resp.Cookies() {
		if ck.Name == web.SessionCookieName {
			w.cookie = ck.Value
		}
	}
	return w, nil
}

// terminal is one interactive shell, web or SSH, seen as keystrokes in and
// bytes out.
type terminal interface {
	send(ctx context.Context, p []byte) error
	// recv returns the next output bytes.
	recv(ctx context.Context) ([]byte, error)
	Close() error
}

type wsTerminal struct{ c *websocket.Conn }

func (w *wsTerminal) send(ctx context.Context, p []byte) error {
	return w.c.Write(ctx, websocket.MessageBinary, web.EncodeFrame(web.FrameData, p))
}

func (w *wsTerminal) recv(ctx context.Context) ([]byte, error) {
	for {
		_, msg, err := w.c.Read(ctx)
		if err != nil {
			return nil, err
		}
		f, err := web.DecodeFrame(msg)
		if err != nil {
			return nil, err
		}
		switch f.Type {
		case web.FrameData:
			return f.Payload, nil
		case web.FrameError:
			return nil, errors.New(string(f.Payload))
		}
	}
}

func (w *wsTerminal) Close() error { return w.c.Close(websocket.StatusNormalClosure, "") }

// openWeb opens the web terminal: upgrade, token, {"status":"ok"}.
func (w *webClient) open(ctx context.Context, login string) (terminal, error) {
	params, _ := json.Marshal(web.TerminalParams{Host: "bench-node", Login: login, Cols: 80, Rows: 24})
	c, _, err := websocket.Dial(ctx, "wss://"+w.addr+"/webapi/terminal?params="+url.QueryEscape(string(params)), &websocket.DialOptions{
		HTTPClient:   w.hc,
		HTTPHeader:   http.Header{"Cookie": {web.SessionCookieName + "=" + w.cookie}},
		Subprotocols: []string{web.TerminalSubprotocol},
	})
	if err != nil {
		return nil, err
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"token":%q}`, w.token))); err != nil {
		c.CloseNow()
		return nil, err
	}
	if _, msg, err := c.Read(ctx); err != nil || !bytes.Contains(msg, []byte(`"ok"`)) {
		c.CloseNow()
		return nil, fmt.Errorf("terminal auth: %q %v", msg, err)
	}
	return &wsTerminal{c: c}, nil
}

// sshTerminal is a pty shell through the proxy (direct-tcpip, as ssh -J
// and psh do), its output delivered by a pump goroutine.
type sshTerminal struct {
	h     *hop
	s     *ssh.Session
	stdin io.WriteCloser
	out   chan []byte
	done  chan struct{}
}

func openSSH(c *cluster) (terminal, error) {
	h, err := dialNode(c.creds(), c.proxy, c.node, nil)
	if err != nil {
		return nil, err
	}
	s, err := h.node.NewSession()
	if err != nil {
		h.Close()
		return nil, err
	}
	stdin, _ := s.StdinPipe()
	stdout, _ := s.StdoutPipe()
	if err := s.RequestPty("xterm-256color", 24, 80, ssh.TerminalModes{ssh.ECHO: 1}); err != nil {
		h.Close()
		return nil, err
	}
	if err := s.Shell(); err != nil {
		h.Close()
		return nil, err
	}
	t := &sshTerminal{h: h, s: s, stdin: stdin, out: make(chan []byte, 64), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		defer close(t.out)
		for {
			buf := make([]byte, 32<<10)
			n, err := stdout.Read(buf)
			if n > 0 {
				t.out <- buf[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	return t, nil
}

func (t *sshTerminal) send(_ context.Context, p []byte) error {
	_, err := t.stdin.Write(p)
	return err
}

func (t *sshTerminal) recv(ctx context.Context) ([]byte, error) {
	select {
	case p, ok := <-t.out:
		if !ok {
			return nil, io.EOF
		}
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (t *sshTerminal) Close() error {
	err := t.h.Close()
	for range t.out {
	}
	<-t.done
	return err
}

// measure opens a terminal, times the first output byte (the start of the
// shell's prompt or login banner) and then echoRounds keystroke echoes.
func measure(ctx context.Context, open func() (terminal, error)) (first, echo time.Duration, err error) {
	start := time.Now()
	t, err := open()
	if err != nil {
		return 0, 0, err
	}
	defer t.Close()
	if _, err := t.recv(ctx); err != nil {
		return 0, 0, err
	}
	first = time.Since(start)
	// Let the shell settle into its prompt before timing keystrokes.
	if err := t.send(ctx, []byte("echo rea''dy\n")); err != nil {
		return 0, 0, err
	}
	var seen []byte
	for !bytes.Contains(seen, []byte("ready")) {
		p, err := t.recv(ctx)
		if err != nil {
			return 0, 0, err
		}
		seen = append(seen, p...)
	}
	for i := 0; i < echoRounds; i++ {
		key := []byte{byte('a' + i%26)}
		t0 := time.Now()
		if err := t.send(ctx, key); err != nil {
			return 0, 0, err
		}
		for {
			p, err := t.recv(ctx)
			if err != nil {
				return 0, 0, err
			}
			if bytes.Contains(p, key) {
				break
			}
		}
		echo += time.Since(t0)
	}
	_ = t.send(ctx, []byte("\x15exit\n"))
	return first, echo / echoRounds, nil
}

// BenchmarkWebTerminal compares the web terminal with an x/crypto SSH
// client through the proxy (what psh ssh does), interleaved per op so both
// see the same load: time from opening the socket (websocket dial vs TCP
// dial to the proxy) to the first byte of the shell's output, and the
// round trip of one keystroke echoed by the remote pty. Both start the
// same login's shell, whose start-up dominates the first number.
func BenchmarkWebTerminal(b *testing.B) {
	c := getCluster(b)
	wc, err := webLogin(c)
	if err != nil {
		b.Fatal(err)
	}
	defer wc.hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var webFirst, webEcho, sshFirst, sshEcho time.Duration
	for i := 0; i < b.N; i++ {
		f, e, err := measure(ctx, func() (terminal, error) { return wc.open(ctx, c.login) })
		if err != nil {
			b.Fatalf("web: %v", err)
		}
		webFirst, webEcho = webFirst+f, webEcho+e
		f, e, err = measure(ctx, func() (terminal, error) { return openSSH(c) })
		if err != nil {
			b.Fatalf("ssh: %v", err)
		}
		sshFirst, sshEcho = sshFirst+f, sshEcho+e
	}
	n := float64(b.N)
	b.ReportMetric(float64(webFirst.Microseconds())/1000/n, "web-first-byte-ms")
	b.ReportMetric(float64(sshFirst.Microseconds())/1000/n, "ssh-first-byte-ms")
	b.ReportMetric(float64(webFirst)/float64(sshFirst), "first-byte-web/ssh")
	b.ReportMetric(float64(webEcho.Microseconds())/n, "web-echo-us")
	b.ReportMetric(float64(sshEcho.Microseconds())/n, "ssh-echo-us")
	b.ReportMetric(float64(webEcho)/float64(sshEcho), "echo-web/ssh")
}
