package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/services"
)

// testTimeout bounds each test's network waits (real time: sockets).
const testTimeout = 20 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func defaultParams() TerminalParams {
	return TerminalParams{Host: "node1", Login: "alice", Cols: 80, Rows: 24}
}

func TestWebSessionCookieAndNodes(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	require.True(t, ws.cookie.HttpOnly)
	require.True(t, ws.cookie.Secure)
	require.Equal(t, http.SameSiteStrictMode, ws.cookie.SameSite)
	require.Equal(t, "/", ws.cookie.Path)
	require.Empty(t, ws.cookie.Domain)
	require.NotEqual(t, ws.cookie.Value, ws.token, "cookie and bearer token must be different secrets")

	// Cookie alone (what a cross-site request carries) is not enough, nor
	// is the token alone.
	resp, body := e.do(t, http.MethodGet, "/webapi/nodes", "", webSession{cookie: ws.cookie}, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, string(body))
	resp, body = e.do(t, http.MethodGet, "/webapi/nodes", "", webSession{token: ws.token}, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, string(body))

	resp, body = e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var nodes webapi.NodesResponse
	require.NoError(t, json.Unmarshal(body, &nodes))
	require.Len(t, nodes.Items, 1)
	require.Equal(t, "node1", nodes.Items[0].Hostname)
	require.ElementsMatch(t, []string{"alice", "deploy"}, nodes.Items[0].Logins)

	// The session record holds hashes only.
	items, err := e.store.Backend().GetRange(context.Background(), "/web/sessions/", 0)
	require.NoError(t, err)
	require.Len(t, items, 1)
	require.NotContains(t, string(items[0].Value), ws.token)
	require.NotContains(t, items[0].Key, ws.cookie.Value)

	// Logout: 204, then the same credentials are refused.
	resp, _ = e.do(t, http.MethodDelete, "/webapi/sessions", "", ws, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	resp, _ = e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestWebSessionNodesFollowRBAC(t *testing.T) {
	e := newTermEnv(t)
	ctx := context.Background()
	require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Kind: "role", Metadata: services.Metadata{Name: "prod-only"}, Spec: services.RoleSpec{
		Logins: []string{"{{internal.logins}}"}, NodeLabels: map[string]services.LabelValues{"env": {"prod"}},
	}}))
	_, err := e.auth.CreateUser(ctx, "bob", []byte(testPassword), []string{"bob"}, []string{"prod-only"}, false)
	require.NoError(t, err)
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":"bob","password":%q,"otp_token":""}`, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	ws := webSession{cookie: resp.Cookies()[0], token: out.Token}

	resp, body = e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.JSONEq(t, `{"items":[]}`, string(body))

	// The terminal answers exactly as for a node that does not exist.
	tctx := testCtx(t)
	c := e.dialTerminal(t, tctx, ws, TerminalParams{Host: "node1", Login: "bob", Cols: 80, Rows: 24})
	openTerminal(t, tctx, c, ws.token)
	f := readUntil(t, tctx, c, FrameError, "")
	require.Equal(t, `node "node1" not found in cluster "c1"`, string(f.Payload))
	requireClosed(t, tctx, c, closeError, "not found")
	e.node.mu.Lock()
	defer e.node.mu.Unlock()
	require.Zero(t, e.node.accepted, "a denied node must not be dialed")
}

func TestWebSessionLoginCSRFAndRateLimit(t *testing.T) {
	e := newTermEnv(t)
	body := fmt.Sprintf(`{"user":%q,"password":%q,"otp_token":""}`, testUser, testPassword)
	resp, data := e.do(t, http.MethodPost, "/webapi/sessions", body, webSession{}, http.Header{"Sec-Fetch-Site": {"cross-site"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, string(data))
	resp, data = e.do(t, http.MethodPost, "/webapi/sessions", body, webSession{}, http.Header{"Origin": {"https://evil.example"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, string(data))
	resp, data = e.do(t, http.MethodPost, "/webapi/sessions", body, webSession{}, http.Header{"Origin": {e.url}, "Sec-Fetch-Site": {"same-origin"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, string(data))

	bad := fmt.Sprintf(`{"user":%q,"password":"wrong","otp_token":""}`, testUser)
	for range 3 {
		resp, data = e.do(t, http.MethodPost, "/webapi/sessions", bad, webSession{}, nil)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, string(data))
	}
	resp, data = e.do(t, http.MethodPost, "/webapi/sessions", body, webSession{}, nil)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, string(data))
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
}

func TestWebSessionIdleExpiry(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	e.clock.Advance(DefaultSessionIdleTTL - time.Minute)
	resp, _ := e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "activity within the idle TTL keeps the session")
	e.clock.Advance(DefaultSessionIdleTTL - time.Minute)
	resp, _ = e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the last use pushed the idle expiry")
	e.clock.Advance(DefaultSessionIdleTTL)
	resp, _ = e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestTerminalRefusesMissingOrWrongToken(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	cases := []struct {
		name  string
		ws    webSession
		first string
	}{
		{"no token", ws, `{}`},
		{"not JSON", ws, `hello`},
		{"wrong token", ws, `{"token":"0000"}`},
		{"no cookie", webSession{}, fmt.Sprintf(`{"token":%q}`, ws.token)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := e.dialTerminal(t, ctx, tc.ws, defaultParams())
			require.NoError(t, c.Write(ctx, websocket.MessageText, []byte(tc.first)))
			requireClosed(t, ctx, c, websocket.StatusPolicyViolation, "")
		})
	}
	// A token-less socket that says nothing is closed when the auth
	// timeout passes on the server's clock.
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	closed := make(chan error, 1)
	go func() {
		_, _, err := c.Read(ctx)
		closed <- err
	}()
	// The handler arms its timer after the upgrade; advance until it fires.
	var err error
wait:
	for {
		select {
		case err = <-closed:
			break wait
		case <-time.After(10 * time.Millisecond):
			e.clock.Advance(authTimeout)
		}
	}
	var ce websocket.CloseError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, websocket.StatusPolicyViolation, ce.Code)
	require.Contains(t, ce.Reason, "token")

	e.node.mu.Lock()
	defer e.node.mu.Unlock()
	require.Zero(t, e.node.accepted)
}

func TestTerminalSession(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")

	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("hello"))))
	readUntil(t, ctx, c, FrameData, "hello")

	// Unknown frame types and text messages are ignored; the session goes on.
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame('z', []byte("???"))))
	require.NoError(t, c.Write(ctx, websocket.MessageText, []byte("text")))
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameResize, []byte(`{"cols":0,"rows":-1}`))))

	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameResize, []byte(`{"cols":132,"rows":40}`))))
	readUntil(t, ctx, c, FrameData, "size=132x40")

	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FramePing, []byte("12345.5"))))
	f := readUntil(t, ctx, c, FramePong, "")
	require.Equal(t, "12345.5", string(f.Payload))

	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("exit\r"))))
	f = readUntil(t, ctx, c, FrameClose, "")
	var cm CloseMessage
	require.NoError(t, json.Unmarshal(f.Payload, &cm))
	require.Equal(t, CloseMessage{Code: 3, Reason: "session ended"}, cm)
	requireClosed(t, ctx, c, websocket.StatusNormalClosure, "session ended")
	<-e.node.ended
}

func TestTerminalRoutingErrorsVerbatim(t *testing.T) {
	e := newTermEnv(t)
	ctx := context.Background()
	// A second node with the same hostname makes "node1" ambiguous.
	other := newTestNode(t, e.auth, "1c9d7d7f-3e66-4a8d-8e5c-7b1d2a4cab02", "node1")
	require.NoError(t, e.store.UpsertNode(ctx, services.Node{UUID: "1c9d7d7f-3e66-4a8d-8e5c-7b1d2a4cab02", Hostname: "node1", Addr: other.addr(), Cluster: "c1", Expires: e.clock.Now().Add(time.Hour), LastHeartbeat: e.clock.Now()}))
	ws := e.login(t)
	tctx := testCtx(t)

	c := e.dialTerminal(t, tctx, ws, TerminalParams{Host: "nope", Login: "alice", Cols: 80, Rows: 24})
	openTerminal(t, tctx, c, ws.token)
	f := readUntil(t, tctx, c, FrameError, "")
	require.Equal(t, `node "nope" not found in cluster "c1"`, string(f.Payload))
	requireClosed(t, tctx, c, closeError, `node "nope" not found`)

	// The ambiguity list (uuid per line) arrives whole in the error frame;
	// the close reason is cut to the protocol's 123 bytes. Wait until the
	// watcher has seen the second node.
	require.Eventually(t, func() bool {
		c := e.dialTerminal(t, tctx, ws, defaultParams())
		openTerminal(t, tctx, c, ws.token)
		_, msg, err := c.Read(tctx)
		require.NoError(t, err)
		fr, err := DecodeFrame(msg)
		require.NoError(t, err)
		if fr.Type != FrameError {
			return false
		}
		s := string(fr.Payload)
		require.Contains(t, s, `ambiguous host "node1" matches 2 nodes in cluster "c1"`)
		require.Contains(t, s, testNodeUUID)
		require.Contains(t, s, "1c9d7d7f-3e66-4a8d-8e5c-7b1d2a4cab02")
		return true
	}, testTimeout, 10*time.Millisecond)

	// Bad params are reported the same way.
	c = e.dialTerminal(t, tctx, ws, TerminalParams{Host: "node1", Login: "alice", Cols: 0, Rows: 24})
	openTerminal(t, tctx, c, ws.token)
	f = readUntil(t, tctx, c, FrameError, "")
	require.Contains(t, string(f.Payload), "terminal size 0x24 out of range")
}

func TestTerminalOversizedFrame(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	big := EncodeFrame(FrameData, []byte(strings.Repeat("x", MaxFrameSize)))
	_ = c.Write(ctx, websocket.MessageBinary, big)
	requireClosed(t, ctx, c, websocket.StatusMessageTooBig, "")
	// The SSH session on the node ends with it.
	select {
	case <-e.node.ended:
	case <-ctx.Done():
		t.Fatal("the node session outlived the socket")
	}
}

func TestTerminalBrowserVanishes(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	<-e.node.started

	// The browser's TCP connection disappears without a close frame.
	e.mu.Lock()
	require.Len(t, e.dialed, 1)
	e.dialed[0].Close()
	e.mu.Unlock()

	select {
	case <-e.node.ended:
	case <-ctx.Done():
		t.Fatal("the node session outlived the browser")
	}
	// The terminal handler and its goroutines are gone too: shutdown
	// would otherwise wait for them (and goleak in TestMain checks).
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		e.server.web.terminals.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-sctx.Done():
		t.Fatal("the terminal handler did not end")
	}
}

func TestTerminalEndsOnLogout(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")

	resp, _ := e.do(t, http.MethodDelete, "/webapi/sessions", "", ws, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	f := readUntil(t, ctx, c, FrameError, "")
	require.Contains(t, string(f.Payload), "web session ended")
	requireClosed(t, ctx, c, closeError, "")
	<-e.node.ended
}

func TestTerminalRefusesCrossOrigin(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	req, err := http.NewRequest(http.MethodGet, e.url+"/webapi/terminal", nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Sec-WebSocket-Protocol", TerminalSubprotocol)
	req.Header.Set("Origin", "https://evil.example")
	req.AddCookie(&http.Cookie{Name: SessionCookieName, Value: ws.cookie.Value})
	resp, err := e.http.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

func TestUIServedWithCSP(t *testing.T) {
	e := newTermEnv(t)
	resp, body := e.do(t, http.MethodGet, "/", "", webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "Postern")
	csp := resp.Header.Get("Content-Security-Policy")
	require.Contains(t, csp, "script-src 'self'")
	// JavaScript eval stays off; only WebAssembly compilation (the
	// recording player's emulator) is allowed.
	require.NotContains(t, csp, "'unsafe-eval'")
	require.Contains(t, csp, "'wasm-unsafe-eval'")
	resp, _ = e.do(t, http.MethodGet, "/webapi/nope", "", webSession{}, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	// The app's pages are 200; a path it has no page for is 404 (with
	// the app, which says so), not the node list under a 200.
	for _, p := range []string{"/web/sessions", "/web/recordings", "/web/recordings/0d421dfd-4ba4-4028-9165-65ef13f0c62b", "/web/cluster/c/node/u/root.admin", "/web/"} {
		resp, _ = e.do(t, http.MethodGet, p, "", webSession{}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, p)
	}
	for _, p := range []string{"/web/nope", "/nope", "/web/cluster/c/node", "/web/recordings/not-a-uuid"} {
		resp, body := e.do(t, http.MethodGet, p, "", webSession{}, nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, p)
		require.Contains(t, string(body), "Postern", p)
	}
}

func TestTerminalUseKeepsSessionAlive(t *testing.T) {
	// The clock jumps 20 minutes at a time, faster than any pong could
	// answer a keep-alive ping: keep those out of this test.
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.KeepAliveInterval = 24 * time.Hour })
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	// A browser reads all the time, which also answers the server's
	// keep-alive pings while the clock jumps.
	pongs := make(chan struct{}, 4)
	go func() {
		for {
			_, msg, err := c.Read(ctx)
			if err != nil {
				close(pongs)
				return
			}
			if f, err := DecodeFrame(msg); err == nil && f.Type == FramePong {
				pongs <- struct{}{}
			}
		}
	}()
	for i := range 2 {
		e.clock.Advance(DefaultSessionIdleTTL * 2 / 3)
		require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte(fmt.Sprintf("key%d", i)))))
		// The pong comes after the keystroke's frame was handled.
		require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FramePing, []byte("t"))))
		_, ok := <-pongs
		require.True(t, ok, "socket closed")
	}
	// 40 minutes without API calls, but the terminal was in use.
	resp, _ := e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	c.Close(websocket.StatusNormalClosure, "")
	for range pongs {
	}
}

func TestTerminalEndsAtSessionExpiry(t *testing.T) {
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.KeepAliveInterval = 24 * time.Hour })
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	e.clock.Advance(DefaultSessionTTL)
	f := readUntil(t, ctx, c, FrameError, "")
	require.Contains(t, string(f.Payload), "web session expired")
	requireClosed(t, ctx, c, closeError, "expired")
	<-e.node.ended
}

// TestTerminalSendsBrowserLocale: the browser's locale in the params
// reaches the node as LANG (the node decides whether it has it); none is
// sent without one, and a value that is not a locale name refuses the
// params.
func TestTerminalSendsBrowserLocale(t *testing.T) {
	e := newTermEnv(t)
	ws := e.login(t)
	ctx := testCtx(t)

	p := defaultParams()
	p.Lang = "ja_JP.UTF-8"
	c := e.dialTerminal(t, ctx, ws, p)
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	require.Equal(t, "LANG=ja_JP.UTF-8", <-e.node.envs)
	c.CloseNow()

	c = e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	require.Empty(t, e.node.envs, "no locale, no env request")
	c.CloseNow()

	for _, bad := range []string{"en_US.UTF-8; reboot", "../../etc/x", strings.Repeat("a", 65)} {
		_, err := DecodeTerminalParams(fmt.Sprintf(`{"host":"n","login":"l","cols":80,"rows":24,"lang":%q}`, bad))
		require.ErrorContains(t, err, "lang", bad)
	}
}
