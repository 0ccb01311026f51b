package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/recording/recpolicy/recpolicytest"
	"github.com/postern-dev/postern/lib/services"
)

// TestWebTerminalRecordingDecisionTable runs the recording decisions both
// doors share (recpolicytest.Cases; lib/srv runs the same table through a
// node's sessions) through the proxy's web terminal to an OpenSSH node:
// the same decision, the same session.start recording fields, the same
// access.denied fields.
func TestWebTerminalRecordingDecisionTable(t *testing.T) {
	for _, tc := range recpolicytest.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			rec := events.NewRecorder()
			e := newTermEnv(t, func(c *WebSessionsConfig) {
				c.Audit = rec
				c.Recorder = &TerminalRecorder{Spool: recording.DirStorage{Dir: t.TempDir()}, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
					return tc.Settings()
				}}
			})
			useOpenSSHNode(t, e)
			ws := loginWithRecordingRole(t, e, tc.RoleMode)
			ctx := testCtx(t)
			c := e.dialTerminal(t, ctx, ws, TerminalParams{Host: "node1", Login: "dave", Cols: 80, Rows: 24})
			openTerminal(t, ctx, c, ws.token)
			if !tc.Refused {
				readUntil(t, ctx, c, FrameData, "prompt$ ")
				start := waitAudit(t, rec, events.SessionStart, func(events.Event) bool { return true })
				require.Equal(t, tc.StartFields(), recpolicytest.Pick(start.Fields, recpolicytest.RecordingStartKeys))
				require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("exit"))))
				requireClosed(t, ctx, c, websocket.StatusNormalClosure, "")
				return
			}
			readUntil(t, ctx, c, FrameError, "")
			denied := waitAudit(t, rec, events.AccessDenied, func(ev events.Event) bool { return ev.User == "dave" })
			require.Equal(t, tc.Reason, denied.Fields[events.FieldReason])
			require.Equal(t, tc.RequiredBy(), denied.Fields["required_by"])
			require.Equal(t, auditMethod, denied.Fields[events.FieldMethod])
			require.Equal(t, auditKind, denied.Fields[events.FieldKind])
			require.Equal(t, recpolicytest.Sorted(recpolicytest.RefusedKeys), recpolicytest.Keys(denied.Fields))
		})
	}
}

// loginWithRecordingRole creates dave, whose one role (recpolicytest.Role)
// lets him in with session_recording mode, and logs him in.
func loginWithRecordingRole(t *testing.T, e *termEnv, mode string) webSession {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Kind: "role", Metadata: services.Metadata{Name: recpolicytest.Role}, Spec: services.RoleSpec{
		Logins: []string{"{{internal.logins}}"}, NodeLabels: map[string]services.LabelValues{"*": {"*"}}, SessionRecording: mode,
	}}))
	_, err := e.auth.CreateUser(ctx, "dave", []byte(testPassword), []string{"dave"}, []string{recpolicytest.Role}, false)
	require.NoError(t, err)
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":"dave","password":%q,"otp_token":""}`, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	return webSession{cookie: resp.Cookies()[0], token: out.Token}
}
