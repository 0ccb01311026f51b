package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/web"
)

// checkOpenSSHWebTerminal: a web terminal to the OpenSSH node "legacy"
// (the proxy is its SSH client, checking the host certificate for the
// node's name) runs a command and exits; the proxy recorded it, with
// the same format and hash chain as a node's recording: psh play shows
// the output, pctl recordings verify the chain, and session.start and
// session.end say recorded.
func checkOpenSSHWebTerminal(t *testing.T, c *allInOne, e *pshEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wc := webTermLogin(t, c)
	params, err := json.Marshal(webterm.TerminalParams{Host: "legacy", Login: c.login, Cols: 100, Rows: 30})
	require.NoError(t, err)
	ws, _, err := websocket.Dial(ctx, "wss://"+wc.addr+"/webapi/terminal?params="+url.QueryEscape(string(params)), &websocket.DialOptions{
		HTTPClient:   wc.hc,
		HTTPHeader:   http.Header{"Cookie": {web.SessionCookieName + "=" + wc.cookie.Value}},
		Subprotocols: []string{webterm.TerminalSubprotocol},
	})
	require.NoError(t, err)
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	ack := uint64(0)
	first, err := json.Marshal(webterm.AuthMessage{Token: wc.token, Ack: &ack})
	require.NoError(t, err)
	require.NoError(t, ws.Write(ctx, websocket.MessageText, first))
	_, msg, err := ws.Read(ctx)
	require.NoError(t, err)
	require.JSONEq(t, `{"status":"ok"}`, string(msg))
	// The output is computed by the shell, so that it is not the echo
	// of what was typed.
	require.NoError(t, ws.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameData, []byte("echo web-$((6*7))-openssh; exit 7\r"))))
	var info webterm.Session
	var screen strings.Builder
	var closed web.CloseMessage
	for closed.Reason == "" {
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
		case webterm.FrameClose:
			require.NoError(t, json.Unmarshal(f.Payload, &closed))
		}
	}
	require.Contains(t, screen.String(), "web-42-openssh")
	require.Equal(t, 7, closed.Code, "reason %q", closed.Reason)
	sid := info.ID
	require.Regexp(t, `^[0-9a-f-]{36}$`, sid, "a recorded terminal's id is its recording's session id")

	var last string
	require.Eventually(t, func() bool {
		last, _, _ = pctl(t, c.dataDir, "", "recordings", "ls")
		return regexp.MustCompile(`(?m)^` + sid + `\b.*\blegacy\b.*\btrue\b`).MatchString(last)
	}, 30*time.Second, 200*time.Millisecond, "no complete recording of the web terminal: %s", last)

	played := e.mustRun(t, "", "play", sid, "--format", "text")
	require.Contains(t, played, "web-42-openssh")
	require.Regexp(t, `\[marker [0-9.]+s\] exit-status 7\n$`, played)
	require.Contains(t, mustPctl(t, c.dataDir, "", "recordings", "verify", sid), "hash chain intact")

	for _, typ := range []string{"session.start", "session.end"} {
		require.Eventually(t, func() bool {
			last = mustPctl(t, c.dataDir, "", "events", "ls", "--type", typ, "--format", "json")
			for _, line := range strings.Split(last, "\n") {
				if strings.Contains(line, `"session_id":"`+sid+`"`) {
					return strings.Contains(line, `"recorded":true`) && strings.Contains(line, `"method":"web"`)
				}
			}
			return false
		}, 20*time.Second, 100*time.Millisecond, "%s: %s", typ, last)
	}
}
