package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/web"
)

// webTermClient is a browser of a real postern process: its HTTPS client,
// cookie and bearer token.
type webTermClient struct {
	addr   string
	hc     *http.Client
	cookie *http.Cookie
	token  string
}

func webTermLogin(t testing.TB, c *allInOne) *webTermClient {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(c.dataDir, "web", web.SelfSignedCertFile))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(tr.CloseIdleConnections)
	wc := &webTermClient{addr: c.p.Addr(service.ListenerWeb).String(), hc: &http.Client{Transport: tr}}
	resp, err := wc.hc.Post("https://"+wc.addr+"/webapi/sessions", "application/json",
		strings.NewReader(`{"user":"alice","password":"correct horse battery","otp_token":""}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var sess webapi.CreateSessionResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&sess))
	wc.token = sess.Token
	for _, ck := range resp.Cookies() {
		if ck.Name == web.SessionCookieName {
			wc.cookie = ck
		}
	}
	require.NotNil(t, wc.cookie)
	return wc
}

// open dials the terminal in the resumable dialect and reads frames
// until the output matches re; it returns the socket, the session frame
// and the match.
func (wc *webTermClient) open(t *testing.T, ctx context.Context, c *allInOne, resume string, input string, re *regexp.Regexp) (*websocket.Conn, webterm.Session, []string) {
	t.Helper()
	params, err := json.Marshal(webterm.TerminalParams{Host: c.hostname, Login: c.login, Cols: 100, Rows: 30})
	require.NoError(t, err)
	ws, _, err := websocket.Dial(ctx, "wss://"+wc.addr+"/webapi/terminal?params="+url.QueryEscape(string(params)), &websocket.DialOptions{
		HTTPClient:   wc.hc,
		HTTPHeader:   http.Header{"Cookie": {web.SessionCookieName + "=" + wc.cookie.Value}},
		Subprotocols: []string{webterm.TerminalSubprotocol},
	})
	require.NoError(t, err)
	t.Cleanup(func() { ws.CloseNow() })
	ws.SetReadLimit(1 << 20)
	ack := uint64(0)
	first, err := json.Marshal(webterm.AuthMessage{Token: wc.token, Resume: resume, Ack: &ack})
	require.NoError(t, err)
	require.NoError(t, ws.Write(ctx, websocket.MessageText, first))
	_, msg, err := ws.Read(ctx)
	require.NoError(t, err)
	require.JSONEq(t, `{"status":"ok"}`, string(msg))
	require.NoError(t, ws.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameData, []byte(input))))
	var info webterm.Session
	var screen strings.Builder
	for {
		_, msg, err := ws.Read(ctx)
		require.NoError(t, err, "screen so far: %q", screen.String())
		f, err := webterm.DecodeFrame(msg)
		require.NoError(t, err)
		switch f.Type {
		case webterm.FrameSession:
			require.NoError(t, json.Unmarshal(f.Payload, &info))
		case webterm.FrameError:
			t.Fatalf("terminal error: %s", f.Payload)
		case webterm.FrameData:
			_, data, err := webterm.DecodeSeq(f.Payload)
			require.NoError(t, err)
			screen.Write(data)
		}
		if m := re.FindStringSubmatch(screen.String()); m != nil {
			return ws, info, m
		}
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// TestWebTerminalResumeAndGraceExpiry, against a real postern with real
// shells: a detached web terminal keeps its shell, a resume reattaches
// to the same process, and when nobody resumes within
// web_terminal_grace the shell is hung up (the process is gone) and
// session.end says why.
func TestWebTerminalResumeAndGraceExpiry(t *testing.T) {
	const grace = 3 * time.Second
	c := newAllInOneWith(t, func(cfg *config.Config) {
		g := grace
		cfg.WebTerminalGrace = &g
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wc := webTermLogin(t, c)

	ws, info, m := wc.open(t, ctx, c, "", "echo PID=$$\n", regexp.MustCompile(`PID=(\d+)`))
	pid, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.EqualValues(t, 3, info.GraceSeconds)
	ws.CloseNow() // the browser vanishes
	require.True(t, processAlive(pid), "the shell survives its socket")

	ws, info2, m := wc.open(t, ctx, c, info.Resume, "echo AGAIN=$$\n", regexp.MustCompile(`AGAIN=(\d+)`))
	require.Equal(t, strconv.Itoa(pid), m[1], "the resume reattached to the same shell")
	require.Equal(t, info.ID, info2.ID)
	ws.CloseNow()
	detached := time.Now()

	require.Eventually(t, func() bool { return !processAlive(pid) }, 20*time.Second, 50*time.Millisecond, "the shell outlived the grace period")
	require.GreaterOrEqual(t, time.Since(detached), grace-500*time.Millisecond, "hung up before the grace period ended")

	clt := adminClient(t, c.dataDir, c.p)
	var end events.Event
	require.Eventually(t, func() bool {
		found, err := clt.SearchEvents(ctx, time.Now().Add(-time.Hour), events.SessionEnd, 100)
		if err != nil {
			return false
		}
		for _, e := range found {
			if e.Fields[events.FieldSessionID] == info.ID {
				end = e
				return true
			}
		}
		return false
	}, 20*time.Second, 100*time.Millisecond)
	require.Contains(t, end.Fields[events.FieldReason], "grace period")
	require.Equal(t, "terminal", end.Fields[events.FieldKind])

	// The token of an expired terminal is refused.
	params, _ := json.Marshal(webterm.TerminalParams{Host: c.hostname, Login: c.login, Cols: 80, Rows: 24})
	late, _, err := websocket.Dial(ctx, "wss://"+wc.addr+"/webapi/terminal?params="+url.QueryEscape(string(params)), &websocket.DialOptions{
		HTTPClient: wc.hc, HTTPHeader: http.Header{"Cookie": {web.SessionCookieName + "=" + wc.cookie.Value}}, Subprotocols: []string{webterm.TerminalSubprotocol},
	})
	require.NoError(t, err)
	defer late.CloseNow()
	ack := uint64(0)
	first, _ := json.Marshal(webterm.AuthMessage{Token: wc.token, Resume: info2.Resume, Ack: &ack})
	require.NoError(t, late.Write(ctx, websocket.MessageText, first))
	_, _, err = late.Read(ctx)
	var ce websocket.CloseError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, websocket.StatusPolicyViolation, ce.Code)
	require.Contains(t, ce.Reason, "resume refused")
}
