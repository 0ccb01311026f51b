package web

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/events"
)

// seqClient is a browser speaking the resumable dialect: it checks that
// output frames are contiguous (nothing lost, nothing repeated) and
// keeps what the server said about the session.
type seqClient struct {
	c       *websocket.Conn
	off     uint64
	out     bytes.Buffer
	session webterm.Session
	repaint []byte
	notice  string
	// noConfirm: a client lost before it read FrameSession never
	// confirms the new token.
	noConfirm bool
}

// openSeq dials the terminal and sends {"token","resume","ack"}.
func (e *termEnv) openSeq(t *testing.T, ctx context.Context, ws webSession, resume string, ack uint64) *seqClient {
	t.Helper()
	c := e.dialTerminal(t, ctx, ws, TerminalParams{Host: "node1", Login: "alice", Cols: 80, Rows: 24})
	msg, err := json.Marshal(webterm.AuthMessage{Token: ws.token, Resume: resume, Ack: &ack})
	require.NoError(t, err)
	require.NoError(t, c.Write(ctx, websocket.MessageText, msg))
	return &seqClient{c: c, off: ack}
}

func (sc *seqClient) ok(t *testing.T, ctx context.Context) {
	t.Helper()
	typ, msg, err := sc.c.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, websocket.MessageText, typ)
	require.JSONEq(t, `{"status":"ok"}`, string(msg))
}

// readUntil reads until the output (or a repaint) contains want.
func (sc *seqClient) readUntil(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	for {
		if want == noticeWanted {
			if sc.notice != "" {
				return
			}
		} else if strings.Contains(sc.out.String(), want) || bytes.Contains(sc.repaint, []byte(want)) {
			return
		}
		_, msg, err := sc.c.Read(ctx)
		require.NoError(t, err, "waiting for %q; saw %q", want, sc.out.String())
		f, err := webterm.DecodeFrame(msg)
		require.NoError(t, err)
		switch f.Type {
		case webterm.FrameSession:
			require.NoError(t, json.Unmarshal(f.Payload, &sc.session))
			if !sc.noConfirm {
				// As the browser does: it holds the new token.
				require.NoError(t, sc.c.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameSession, nil)))
			}
		case webterm.FrameData:
			seq, data, err := webterm.DecodeSeq(f.Payload)
			require.NoError(t, err)
			require.Equal(t, sc.off, seq, "output frames must be contiguous")
			sc.off += uint64(len(data))
			sc.out.Write(data)
		case webterm.FrameRepaint:
			seq, data, err := webterm.DecodeSeq(f.Payload)
			require.NoError(t, err)
			sc.off = seq
			sc.repaint = append([]byte(nil), data...)
			sc.out.Reset()
		case webterm.FrameNotice:
			sc.notice = string(f.Payload)
		}
	}
}

// noticeWanted makes readUntil wait for a FrameNotice.
const noticeWanted = "\x00notice"

func (sc *seqClient) send(t *testing.T, ctx context.Context, s string) {
	t.Helper()
	require.NoError(t, sc.c.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameData, []byte(s))))
}

// detached reports whether the terminal named id has no socket.
func (e *termEnv) detached(id string) bool {
	r := &e.server.web.terms
	r.mu.Lock()
	t := r.byID[id]
	r.mu.Unlock()
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.att == nil
}

// TestTerminalResumeExactReplay: output the browser did not acknowledge
// is replayed exactly once on resume, the same shell continues, the
// token is rotated, and the used token is refused (and audited).
func TestTerminalResumeExactReplay(t *testing.T) {
	rec := events.NewRecorder()
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.Audit = rec })
	ctx := testCtx(t)
	ws := e.login(t)

	a := e.openSeq(t, ctx, ws, "", 0)
	a.ok(t, ctx)
	a.readUntil(t, ctx, "prompt$ ")
	require.NotEmpty(t, a.session.ID)
	require.Len(t, a.session.Resume, 2*resumeTokenBytes, "a 256-bit token")
	rendered := a.off
	first := a.session.Resume
	a.send(t, ctx, "one")
	a.readUntil(t, ctx, "prompt$ one")
	// The browser vanishes having rendered only the prompt.
	a.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	b := e.openSeq(t, ctx, ws, first, rendered)
	b.ok(t, ctx)
	b.send(t, ctx, "two")
	b.readUntil(t, ctx, "onetwo")
	require.Equal(t, "onetwo", b.out.String(), "the unacknowledged echo exactly once, then live output")
	require.Equal(t, a.session.ID, b.session.ID, "the same terminal")
	require.NotEqual(t, first, b.session.Resume, "the token rotates")
	require.Equal(t, uint64(3), b.session.Input, "the server says which keystrokes it has")
	select {
	case <-e.node.started:
	default:
		t.Fatal("no shell started")
	}
	require.Empty(t, e.node.started, "no second shell")

	// The used token is refused, and the refusal is audited.
	replay := e.openSeq(t, ctx, ws, first, 0)
	requireClosed(t, ctx, replay.c, websocket.StatusPolicyViolation, "resume refused")
	denied := waitAudit(t, rec, events.AccessDenied, func(ev events.Event) bool {
		return ev.User == testUser && strings.Contains(fmt.Sprint(ev.Fields[events.FieldReason]), "resume refused")
	})
	require.Equal(t, "terminal", denied.Fields[events.FieldKind])
	// The live socket is untouched by the refused attempt.
	b.send(t, ctx, "three")
	b.readUntil(t, ctx, "three")
}

// TestTerminalResumeTokenSurvivesALostSessionFrame: a socket lost after
// the server took the resume token but before the client read the
// FrameSession with the next one leaves the client holding the token it
// used. That token resumes the same shell again, until a client confirms
// the token issued to it; then both older tokens are refused.
func TestTerminalResumeTokenSurvivesALostSessionFrame(t *testing.T) {
	e := newTermEnv(t)
	ctx := testCtx(t)
	ws := e.login(t)
	a := e.openSeq(t, ctx, ws, "", 0)
	a.ok(t, ctx)
	a.readUntil(t, ctx, "prompt$ ")
	first := a.session.Resume
	a.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	// Resumed, and lost before the client took in FrameSession.
	lost := e.openSeq(t, ctx, ws, first, 0)
	lost.noConfirm = true
	lost.ok(t, ctx)
	lost.readUntil(t, ctx, "prompt$ ")
	require.NotEqual(t, first, lost.session.Resume)
	lost.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	b := e.openSeq(t, ctx, ws, first, 0)
	b.ok(t, ctx)
	b.readUntil(t, ctx, "prompt$ ")
	require.Equal(t, a.session.ID, b.session.ID, "the same terminal")
	// Input after the confirmation: the server has read both in order.
	b.send(t, ctx, "x")
	b.readUntil(t, ctx, "prompt$ x")
	// The token used twice and the one never delivered.
	for _, tok := range []string{first, lost.session.Resume} {
		r := e.openSeq(t, ctx, ws, tok, 0)
		requireClosed(t, ctx, r.c, websocket.StatusPolicyViolation, "resume refused")
	}
	b.send(t, ctx, "y")
	b.readUntil(t, ctx, "prompt$ xy")
	select {
	case <-e.node.started:
	default:
		t.Fatal("no shell started")
	}
	require.Empty(t, e.node.started, "no second shell")
}

// TestTerminalResumeOtherUserRefused: user B holding A's resume token
// (and a web session of their own) is refused and audited; A can still
// resume with it.
func TestTerminalResumeOtherUserRefused(t *testing.T) {
	rec := events.NewRecorder()
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.Audit = rec })
	ctx := testCtx(t)
	alice := e.login(t)
	_, err := e.auth.CreateUser(context.Background(), "bob", []byte(testPassword), []string{"bob"}, nil, false)
	require.NoError(t, err)
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":"bob","password":%q,"otp_token":""}`, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	bob := webSession{cookie: resp.Cookies()[0], token: out.Token}

	a := e.openSeq(t, ctx, alice, "", 0)
	a.ok(t, ctx)
	a.readUntil(t, ctx, "prompt$ ")
	a.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	stolen := e.openSeq(t, ctx, bob, a.session.Resume, 0)
	requireClosed(t, ctx, stolen.c, websocket.StatusPolicyViolation, "another web session")
	denied := waitAudit(t, rec, events.AccessDenied, func(ev events.Event) bool { return ev.User == "bob" })
	require.Contains(t, denied.Fields[events.FieldReason], "resume refused")

	// A second web session of alice herself is another session too.
	alice2 := e.login(t)
	other := e.openSeq(t, ctx, alice2, a.session.Resume, 0)
	requireClosed(t, ctx, other.c, websocket.StatusPolicyViolation, "another web session")

	back := e.openSeq(t, ctx, alice, a.session.Resume, a.off)
	back.ok(t, ctx)
	back.send(t, ctx, "still-mine")
	back.readUntil(t, ctx, "still-mine")
}

// TestTerminalResumeRepaintsAfterOverflow: more output than the replay
// buffer arrived since the client's ack, so the resume repaints the
// emulator's screen (alternate screen, modes, cursor) and says what
// scrolled away, instead of replaying a truncated stream.
func TestTerminalResumeRepaintsAfterOverflow(t *testing.T) {
	e := newTermEnv(t)
	// More than testTimeout: the flood is over a MiB through the server's
	// emulator, which -race on a loaded two-core machine slows many times.
	ctx, cancel := context.WithTimeout(context.Background(), 4*testTimeout)
	defer cancel()
	ws := e.login(t)
	a := e.openSeq(t, ctx, ws, "", 0)
	a.ok(t, ctx)
	a.readUntil(t, ctx, "prompt$ ")
	ack := a.off
	a.send(t, ctx, "flood")
	a.readUntil(t, ctx, "END-OF-FLOOD")
	require.Greater(t, a.off-ack, uint64(replayBufferSize))

	// A reload that acknowledged only the prompt takes over the socket.
	b := e.openSeq(t, ctx, ws, a.session.Resume, ack)
	b.ok(t, ctx)
	b.readUntil(t, ctx, "END-OF-FLOOD")
	require.NotNil(t, b.repaint, "a repaint, not a replay")
	require.Equal(t, a.off, b.off, "the repaint stands for everything so far")
	rp := string(b.repaint)
	require.True(t, strings.HasPrefix(rp, "\x1b[?1049h"), "the alternate screen first: %q", rp[:min(len(rp), 40)])
	require.Contains(t, rp, "FULL SCREEN")
	require.Contains(t, rp, "\x1b[?1h", "application cursor keys are restored")
	require.True(t, strings.HasSuffix(rp, "\x1b[3;17H\x1b[?25h"), "the cursor is restored: %q", rp[max(0, len(rp)-20):])
	require.NotContains(t, rp, "0005 xxx", "scrolled-away lines are not replayed")

	r := e.server.web.terms.list(e.server.web.sessions.get(hexKey(ws)))
	require.Len(t, r, 1)
	r[0].outMu.Lock()
	st, _ := r[0].hist.screen()
	r[0].outMu.Unlock()
	require.Contains(t, st.text, "FULL SCREEN")
	require.Equal(t, string(st.repaint), rp, "the browser got the server emulator's screen")
	b.readUntil(t, ctx, noticeWanted)
	require.Contains(t, b.notice, "scrolled away")

	// Live output continues after the repaint, contiguously.
	b.send(t, ctx, "after")
	b.readUntil(t, ctx, "after")
}

// TestTerminalGraceExpiry: a detached terminal nobody resumes is hung
// up when the grace period ends: the shell gets SIGHUP, the session
// closes, session.end says why, and the token is useless afterwards.
func TestTerminalGraceExpiry(t *testing.T) {
	rec := events.NewRecorder()
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.Audit = rec; c.TerminalGrace = 5 * time.Second })
	ctx := testCtx(t)
	ws := e.login(t)
	a := e.openSeq(t, ctx, ws, "", 0)
	a.ok(t, ctx)
	a.readUntil(t, ctx, "prompt$ ")
	require.EqualValues(t, 5, a.session.GraceSeconds)
	a.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	e.clock.Advance(4 * time.Second)
	select {
	case sig := <-e.node.signals:
		t.Fatalf("hung up early: %s", sig)
	default:
	}
	e.clock.Advance(time.Second)
	select {
	case sig := <-e.node.signals:
		require.Equal(t, "HUP", sig)
	case <-ctx.Done():
		t.Fatal("no SIGHUP at grace expiry")
	}
	select {
	case <-e.node.ended:
	case <-ctx.Done():
		t.Fatal("the session did not close")
	}
	end := waitAudit(t, rec, events.SessionEnd, func(ev events.Event) bool { return ev.Fields[events.FieldSessionID] == a.session.ID })
	require.Contains(t, end.Fields[events.FieldReason], "grace period")
	require.Equal(t, "terminal", end.Fields[events.FieldKind])

	late := e.openSeq(t, ctx, ws, a.session.Resume, a.off)
	requireClosed(t, ctx, late.c, websocket.StatusPolicyViolation, "resume refused")
}

// TestTerminalLogoutEndsDetached: logging out ends the web session's
// detached terminals too, and their tokens stop working.
func TestTerminalLogoutEndsDetached(t *testing.T) {
	rec := events.NewRecorder()
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.Audit = rec })
	ctx := testCtx(t)
	ws := e.login(t)
	a := e.openSeq(t, ctx, ws, "", 0)
	a.ok(t, ctx)
	a.readUntil(t, ctx, "prompt$ ")
	a.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	resp, _ := e.do(t, http.MethodDelete, "/webapi/sessions", "", ws, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	select {
	case <-e.node.ended:
	case <-ctx.Done():
		t.Fatal("the detached terminal outlived the logout")
	}
	end := waitAudit(t, rec, events.SessionEnd, func(ev events.Event) bool { return ev.Fields[events.FieldSessionID] == a.session.ID })
	require.Contains(t, end.Fields[events.FieldReason], "logged out")
}

// TestTerminalLegacyClientNotResumable: a page that does not send "ack"
// gets raw frames and today's behaviour: its terminal ends with its
// socket.
func TestTerminalLegacyClientNotResumable(t *testing.T) {
	e := newTermEnv(t)
	ctx := testCtx(t)
	ws := e.login(t)
	c := e.dialTerminal(t, ctx, ws, TerminalParams{Host: "node1", Login: "alice", Cols: 80, Rows: 24})
	openTerminal(t, ctx, c, ws.token)
	f := readUntil(t, ctx, c, FrameData, "prompt$ ")
	require.Equal(t, "prompt$ ", string(f.Payload), "raw bytes, no sequence number")
	c.CloseNow()
	select {
	case <-e.node.ended:
	case <-ctx.Done():
		t.Fatal("a legacy terminal outlived its socket")
	}
}

// hexKey is the store key of a web session.
func hexKey(ws webSession) string { return hex.EncodeToString(hashSecret(ws.cookie.Value)) }

// TestTerminalsListResumeEnd: GET /webapi/terminals lists the web
// session's terminals (not another session's), POST .../resume issues a
// token that resumes it (and retires the previous one), DELETE ends it.
func TestTerminalsListResumeEnd(t *testing.T) {
	e := newTermEnv(t)
	ctx := testCtx(t)
	ws := e.login(t)
	other := e.login(t)
	a := e.openSeq(t, ctx, ws, "", 0)
	a.ok(t, ctx)
	a.readUntil(t, ctx, "prompt$ ")
	a.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	resp, body := e.do(t, http.MethodGet, "/webapi/terminals", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var list TerminalsResponse
	require.NoError(t, json.Unmarshal(body, &list))
	require.Len(t, list.Items, 1)
	item := list.Items[0]
	require.Equal(t, a.session.ID, item.ID)
	require.Equal(t, testNodeUUID, item.Node)
	require.Equal(t, "node1", item.NodeHostname)
	require.Equal(t, "alice", item.Login)
	require.Equal(t, "detached", item.State)
	require.Equal(t, uint64(len("prompt$ ")), item.BytesOut)

	_, body = e.do(t, http.MethodGet, "/webapi/terminals", "", other, nil)
	require.JSONEq(t, `{"items":[]}`, string(body), "another web session sees nothing")
	resp, _ = e.do(t, http.MethodPost, "/webapi/terminals/"+item.ID+"/resume", "", other, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = e.do(t, http.MethodDelete, "/webapi/terminals/"+item.ID, "", other, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	resp, body = e.do(t, http.MethodPost, "/webapi/terminals/"+item.ID+"/resume", "", ws, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var tok ResumeTokenResponse
	require.NoError(t, json.Unmarshal(body, &tok))
	old := e.openSeq(t, ctx, ws, a.session.Resume, 0)
	requireClosed(t, ctx, old.c, websocket.StatusPolicyViolation, "resume refused")
	b := e.openSeq(t, ctx, ws, tok.Resume, 0)
	b.ok(t, ctx)
	b.readUntil(t, ctx, "prompt$ ")
	require.Equal(t, "prompt$ ", b.out.String(), "a fresh page gets the whole history replayed")

	resp, _ = e.do(t, http.MethodDelete, "/webapi/terminals/"+item.ID, "", ws, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	requireClosed(t, ctx, b.c, websocket.StatusNormalClosure, "ended from the sessions list")
	_, body = e.do(t, http.MethodGet, "/webapi/terminals", "", ws, nil)
	require.JSONEq(t, `{"items":[]}`, string(body))
}

// TestTerminalResumeMarksReplay: a new terminal's first attach marks no
// replay (the shell's start-up output is live: it may wait for a
// terminal's answer), and a resume marks where the replayed output ends,
// both for a page that reloaded (ack 0) and for one that kept part of it;
// live output continues from that mark.
func TestTerminalResumeMarksReplay(t *testing.T) {
	e := newTermEnv(t)
	ctx := testCtx(t)
	ws := e.login(t)

	a := e.openSeq(t, ctx, ws, "", 0)
	a.ok(t, ctx)
	a.readUntil(t, ctx, "prompt$ ")
	require.Zero(t, a.session.Replay, "a new terminal's output is live")
	rendered := a.off
	a.send(t, ctx, "one")
	a.readUntil(t, ctx, "prompt$ one")
	end := a.off
	a.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	// A reloaded page: everything is replayed, all of it marked.
	b := e.openSeq(t, ctx, ws, a.session.Resume, 0)
	b.ok(t, ctx)
	b.readUntil(t, ctx, "prompt$ one")
	require.Equal(t, end, b.session.Replay, "the replay ends where the output did")
	require.Equal(t, end, b.off)
	b.send(t, ctx, "two")
	b.readUntil(t, ctx, "onetwo")
	require.Greater(t, b.off, b.session.Replay, "live output follows the mark")
	end = b.off
	b.c.CloseNow()
	require.Eventually(t, func() bool { return e.detached(a.session.ID) }, testTimeout, 10*time.Millisecond)

	// A page that kept the prompt: the rest is replayed and marked.
	c := e.openSeq(t, ctx, ws, b.session.Resume, rendered)
	c.ok(t, ctx)
	c.readUntil(t, ctx, "onetwo")
	require.Equal(t, end, c.session.Replay)
	require.Equal(t, "onetwo", c.out.String())
}
