package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// openSSHEnv is a termEnv whose node is a kind openssh record (the test
// node's certificate names its hostname), recorded by spool when the
// recorder is on, with the cluster's session_recording mode.
func openSSHEnv(t *testing.T, withRecorder bool, mode string, spoolDir ...string) (*termEnv, *events.Recorder, recording.DirStorage) {
	rec := events.NewRecorder()
	spool := recording.DirStorage{Dir: t.TempDir()}
	if len(spoolDir) > 0 {
		spool.Dir = spoolDir[0]
	}
	e := newTermEnv(t, func(c *WebSessionsConfig) {
		c.Audit = rec
		if withRecorder {
			c.Recorder = &TerminalRecorder{Spool: spool, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
				return &services.ClusterNetworkingConfig{Spec: services.ClusterNetworkingConfigSpec{SessionRecording: mode, RecordInput: true}}, nil
			}}
		}
	})
	useOpenSSHNode(t, e)
	return e, rec, spool
}

// useOpenSSHNode makes e's node a kind openssh record and waits until the
// web server's NodeWatcher sees it so.
func useOpenSSHNode(t *testing.T, e *termEnv) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.store.UpsertNode(ctx, services.Node{
		UUID: testNodeUUID, Hostname: "node1", Addr: e.node.addr(), Cluster: "c1", Kind: services.NodeKindOpenSSH,
		Labels: map[string]string{"env": "dev"},
	}))
	// The watcher follows the store asynchronously.
	require.Eventually(t, func() bool {
		n := e.server.cfg.WebSessions.Nodes.(*services.NodeWatcher)
		nodes, err := n.GetNodes(ctx, "c1")
		if err != nil {
			return false
		}
		for _, node := range nodes {
			if node.UUID == testNodeUUID && node.IsOpenSSH() {
				return true
			}
		}
		return false
	}, testTimeout, 10*time.Millisecond)
}

// TestWebTerminalOpenSSHRecordedAtProxy: a terminal to an OpenSSH node
// handshakes for the node's hostname (its certificate does not name the
// UUID) and is recorded by the proxy: output, input, the exit status,
// a hash chain that verifies against session.end's hash; session.start
// and session.end say recorded.
func TestWebTerminalOpenSSHRecordedAtProxy(t *testing.T) {
	e, rec, spool := openSSHEnv(t, true, services.RecordingNode)
	ws := e.login(t)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("hello-openssh"))))
	readUntil(t, ctx, c, FrameData, "hello-openssh")
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("exit"))))
	requireClosed(t, ctx, c, websocket.StatusNormalClosure, "")

	start := waitAudit(t, rec, events.SessionStart, func(events.Event) bool { return true })
	require.Equal(t, true, start.Fields[events.FieldRecorded])
	require.Equal(t, testNodeUUID, start.Fields[events.FieldServerID])
	sid := start.Fields[events.FieldSessionID].(string)
	require.NoError(t, recording.CheckSessionID(sid))
	end := waitAudit(t, rec, events.SessionEnd, func(ev events.Event) bool { return ev.Fields[events.FieldSessionID] == sid })
	require.Equal(t, true, end.Fields[events.FieldRecorded])
	final := end.Fields[events.FieldRecordingHash].(string)

	idx, err := spool.ChunkIndexes(ctx, sid)
	require.NoError(t, err)
	var chunks []recording.Chunk
	for _, i := range idx {
		ch, err := spool.GetChunk(ctx, sid, i)
		require.NoError(t, err)
		chunks = append(chunks, *ch)
	}
	_, err = recording.Verify(chunks, final)
	require.NoError(t, err)
	var cast bytes.Buffer
	require.NoError(t, recording.Export(&cast, chunks))
	h, evs, err := recording.Parse(cast.Bytes())
	require.NoError(t, err)
	require.Equal(t, testUser, h.User)
	require.Equal(t, "alice", h.Login)
	require.Equal(t, testNodeUUID, h.Node)
	require.Equal(t, "node1", h.NodeHostname)
	var all strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&all, "%s %q\n", ev.Code, ev.Data)
	}
	require.Contains(t, all.String(), `o "prompt$ "`)
	require.Contains(t, all.String(), `i "hello-openssh"`, "record_input is on")
	require.Contains(t, all.String(), `o "hello-openssh"`)
	require.Contains(t, all.String(), `m "exit-status 3"`)
}

// TestWebTerminalOpenSSHRecordingPolicy: the cluster's off and a role's
// require apply as on a node: off leaves the terminal unrecorded and
// session.start says why; require with a proxy that does not record, or
// whose spool cannot be written, refuses the terminal, naming the role,
// before any shell starts (even when the cluster says off); without
// require an unwritable spool leaves the terminal unrecorded.
func TestWebTerminalOpenSSHRecordingPolicy(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		e, rec, _ := openSSHEnv(t, true, services.RecordingOff)
		ws := e.login(t)
		ctx := testCtx(t)
		c := e.dialTerminal(t, ctx, ws, defaultParams())
		openTerminal(t, ctx, c, ws.token)
		readUntil(t, ctx, c, FrameData, "prompt$ ")
		start := waitAudit(t, rec, events.SessionStart, func(events.Event) bool { return true })
		require.Equal(t, false, start.Fields[events.FieldRecorded])
		require.Equal(t, "cluster session_recording is off", start.Fields[events.FieldRecordingReason])
		require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("exit"))))
		requireClosed(t, ctx, c, websocket.StatusNormalClosure, "")
	})
	// A spool under a regular file cannot be written, even by root.
	blocked := func(t *testing.T) string {
		f := filepath.Join(t.TempDir(), "file")
		require.NoError(t, os.WriteFile(f, nil, 0o600))
		return filepath.Join(f, "spool")
	}
	requireRefused := func(t *testing.T, e *termEnv, rec *events.Recorder, why string) {
		carol := loginRequired(t, e)
		tctx := testCtx(t)
		c := e.dialTerminal(t, tctx, carol, TerminalParams{Host: "node1", Login: "carol", Cols: 80, Rows: 24})
		openTerminal(t, tctx, c, carol.token)
		f := readUntil(t, tctx, c, FrameError, "")
		require.Contains(t, string(f.Payload), `session recording is required by role "audited"`)
		denied := waitAudit(t, rec, events.AccessDenied, func(ev events.Event) bool { return ev.User == "carol" })
		require.Contains(t, denied.Fields[events.FieldReason], why)
		select {
		case <-e.node.started:
			t.Fatal("a shell started for a terminal whose required recording cannot be made")
		default:
		}
	}
	t.Run("require without a recorder", func(t *testing.T) {
		e, rec, _ := openSSHEnv(t, false, "")
		requireRefused(t, e, rec, "this proxy does not record sessions")
	})
	t.Run("require with a spool that cannot be written", func(t *testing.T) {
		e, rec, _ := openSSHEnv(t, true, services.RecordingOff, blocked(t))
		requireRefused(t, e, rec, "the proxy's recording spool cannot be written")
	})
	t.Run("a spool that cannot be written, not required", func(t *testing.T) {
		e, rec, _ := openSSHEnv(t, true, services.RecordingNode, blocked(t))
		ws := e.login(t)
		ctx := testCtx(t)
		c := e.dialTerminal(t, ctx, ws, defaultParams())
		openTerminal(t, ctx, c, ws.token)
		readUntil(t, ctx, c, FrameData, "prompt$ ")
		start := waitAudit(t, rec, events.SessionStart, func(events.Event) bool { return true })
		require.Equal(t, false, start.Fields[events.FieldRecorded])
		require.Equal(t, "the proxy's recording spool cannot be written", start.Fields[events.FieldRecordingReason])
		require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("exit"))))
		requireClosed(t, ctx, c, websocket.StatusNormalClosure, "")
		end := waitAudit(t, rec, events.SessionEnd, func(events.Event) bool { return true })
		require.Equal(t, false, end.Fields[events.FieldRecorded])
	})
}

// loginRequired creates carol, whose role requires recording, and logs
// her in.
func loginRequired(t *testing.T, e *termEnv) webSession {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Kind: "role", Metadata: services.Metadata{Name: "audited"}, Spec: services.RoleSpec{
		Logins: []string{"{{internal.logins}}"}, NodeLabels: map[string]services.LabelValues{"*": {"*"}}, SessionRecording: services.RecordingRequire,
	}}))
	_, err := e.auth.CreateUser(ctx, "carol", []byte(testPassword), []string{"carol"}, []string{"audited"}, false)
	require.NoError(t, err)
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":"carol","password":%q,"otp_token":""}`, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	return webSession{cookie: resp.Cookies()[0], token: out.Token}
}
