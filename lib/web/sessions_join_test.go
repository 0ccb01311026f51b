package web

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/sessionapi"
	"github.com/postern-dev/postern/lib/api/webterm"
)

const testRoom = "7d4f3c1e-9a2b-4c5d-8e6f-0a1b2c3d4e5f"

// joinSocket opens GET /webapi/sessions/{id}/join?mode= and logs it in.
func joinSocket(t *testing.T, ctx context.Context, e *termEnv, ws webSession, id, mode string) *websocket.Conn {
	t.Helper()
	c := e.dialSocket(t, ctx, ws, "/webapi/sessions/"+id+"/join?mode="+mode)
	openTerminal(t, ctx, c, ws.token)
	return c
}

// requireJoinRefused reads the refusal of a join: the error frame and the
// close, and returns the error text.
func requireJoinRefused(t *testing.T, ctx context.Context, c *websocket.Conn) string {
	t.Helper()
	f := readUntil(t, ctx, c, FrameError, "")
	requireClosed(t, ctx, c, closeError, "not found")
	return string(f.Payload)
}

// TestJoinSessionNotFound: a session the user may not join in the mode
// asked (the node refuses it), one no node lists, and a forged id all
// fail the same way, naming the id and nothing else; a malformed id or
// mode is refused before the upgrade, saying what was wrong.
func TestJoinSessionNotFound(t *testing.T) {
	e := newTermEnv(t)
	waitNodes(t, e, 1)
	ws := e.login(t)
	ctx := testCtx(t)
	e.node.setRoom(testRoom, sessionapi.Observer)

	// Listed, but not joinable as a moderator.
	denied := requireJoinRefused(t, ctx, joinSocket(t, ctx, e, ws, testRoom, "moderator"))
	require.Equal(t, "session "+testRoom+" not found", denied)
	// Not listed by any node.
	forged := "11111111-2222-4333-8444-555555555555"
	missing := requireJoinRefused(t, ctx, joinSocket(t, ctx, e, ws, forged, "observer"))
	require.Equal(t, "session "+forged+" not found", missing)
	require.Equal(t, strings.ReplaceAll(denied, testRoom, forged), missing, "a refused session must look like a missing one")
	select {
	case in := <-e.node.joinInput:
		t.Fatalf("a refused join reached the room: %q", in)
	default:
	}

	for _, tc := range []struct{ path, want string }{
		{"/webapi/sessions/not-a-uuid/join", "malformed session id"},
		{"/webapi/sessions/" + testRoom + "/join?mode=owner", "unknown session join mode"},
		{"/webapi/sessions/" + testRoom + "/join?cols=wide", "malformed cols"},
		{"/webapi/sessions/" + testRoom + "/join?cluster=leaf1", "from the web is not supported"},
	} {
		resp, body := e.do(t, http.MethodGet, tc.path, "", ws, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, tc.path)
		require.Contains(t, string(body), tc.want, tc.path)
	}
	// No session cookie and token: the socket does not authenticate.
	c := e.dialSocket(t, ctx, webSession{}, "/webapi/sessions/"+testRoom+"/join")
	require.NoError(t, c.Write(ctx, websocket.MessageText, []byte(`{"token":"nope"}`)))
	requireClosed(t, ctx, c, websocket.StatusPolicyViolation, "")
}

// TestJoinSessionObserver: an observer sees the room's screen and its
// output, and what it types never reaches the node; it cannot end the
// session; it is not one of the web session's own terminals.
func TestJoinSessionObserver(t *testing.T) {
	e := newTermEnv(t)
	waitNodes(t, e, 1)
	ws := e.login(t)
	ctx := testCtx(t)
	e.node.setRoom(testRoom, sessionapi.Observer, sessionapi.Peer)

	c := joinSocket(t, ctx, e, ws, testRoom, "observer")
	readUntil(t, ctx, c, FrameData, "[postern: alice joined as observer]")
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("rm -rf /\r"))))
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(webterm.FrameEndSession, nil)))
	readUntil(t, ctx, c, webterm.FrameNotice, "Only a moderator")
	// A ping after the keystrokes: once it is answered the keystrokes
	// were handled (frames are read in order) and dropped.
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FramePing, []byte("1"))))
	readUntil(t, ctx, c, FramePong, "")
	select {
	case in := <-e.node.joinInput:
		t.Fatalf("an observer's keystrokes reached the node: %q", in)
	case sig := <-e.node.signals:
		t.Fatalf("an observer's end reached the node: %q", sig)
	default:
	}
	resp, body := e.do(t, http.MethodGet, "/webapi/terminals", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"items":[]}`, string(body))

	// A peer's keystrokes do reach it, through the same socket code.
	p := joinSocket(t, ctx, e, ws, testRoom, "peer")
	readUntil(t, ctx, p, FrameData, "joined as peer")
	require.NoError(t, p.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("ls\r"))))
	readUntil(t, ctx, p, FrameData, "got:ls")
	require.Equal(t, "ls\r", <-e.node.joinInput)

	// Leaving (the browser's close) ends only this party's channel.
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameClose, []byte(`{"code":0,"reason":"left"}`))))
	requireClosed(t, ctx, c, websocket.StatusNormalClosure, "closed by the browser")
	require.NoError(t, p.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("pwd\r"))))
	readUntil(t, ctx, p, FrameData, "got:pwd")
}

// TestJoinSessionModeratorEnds: a moderator's End reaches the node as the
// moderator signal, and the socket closes when the node ends the session.
func TestJoinSessionModeratorEnds(t *testing.T) {
	e := newTermEnv(t)
	waitNodes(t, e, 1)
	ws := e.login(t)
	ctx := testCtx(t)
	e.node.setRoom(testRoom, sessionapi.Moderator)

	c := joinSocket(t, ctx, e, ws, testRoom, "moderator")
	readUntil(t, ctx, c, FrameData, "joined as moderator")
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(webterm.FrameEndSession, nil)))
	select {
	case sig := <-e.node.signals:
		require.Equal(t, "HUP", sig)
	case <-time.After(testTimeout):
		t.Fatal("the moderator's end did not reach the node")
	}
	readUntil(t, ctx, c, FrameClose, "")
}
