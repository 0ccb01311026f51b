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
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

func waitAudit(t *testing.T, rec *events.Recorder, typ string, match func(events.Event) bool) events.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	e, err := rec.Wait(ctx, typ, match)
	require.NoError(t, err, "audited so far: %v", rec.Events())
	return e
}

// TestTerminalDenialsAudited: a terminal refused by RBAC (the user is
// told "not found"), a socket with a wrong token, and an ambiguous target
// are each in the audit log, with the reason, the node and the address.
func TestTerminalDenialsAudited(t *testing.T) {
	rec := events.NewRecorder()
	e := newTermEnv(t, func(c *WebSessionsConfig) { c.Audit = rec })
	ctx := context.Background()

	// RBAC: bob may only reach env=prod; node1 is env=dev.
	require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Kind: "role", Metadata: services.Metadata{Name: "prod-only"}, Spec: services.RoleSpec{
		Logins: []string{"{{internal.logins}}"}, NodeLabels: map[string]services.LabelValues{"env": {"prod"}},
	}}))
	_, err := e.auth.CreateUser(ctx, "bob", []byte(testPassword), []string{"bob"}, []string{"prod-only"}, false)
	require.NoError(t, err)
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":"bob","password":%q,"otp_token":""}`, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	bob := webSession{cookie: resp.Cookies()[0], token: out.Token}
	tctx := testCtx(t)
	c := e.dialTerminal(t, tctx, bob, TerminalParams{Host: "node1", Login: "bob", Cols: 80, Rows: 24})
	openTerminal(t, tctx, c, bob.token)
	f := readUntil(t, tctx, c, FrameError, "")
	require.Equal(t, `node "node1" not found in cluster "c1"`, string(f.Payload), "the user learns nothing")
	denied := waitAudit(t, rec, events.AccessDenied, func(ev events.Event) bool { return ev.User == "bob" })
	require.Equal(t, testNodeUUID, denied.Fields[events.FieldServerID], "the audit log says which node")
	require.Equal(t, "terminal", denied.Fields[events.FieldKind])
	require.Equal(t, "web", denied.Fields[events.FieldMethod])
	require.Equal(t, "node1", denied.Fields[events.FieldTarget])
	require.Equal(t, "bob", denied.Fields[events.FieldLogin])
	require.NotEmpty(t, denied.Fields[events.FieldReason])
	require.NotEmpty(t, denied.Fields[events.FieldRemoteAddr])

	// A wrong token.
	alice := e.login(t)
	c = e.dialTerminal(t, tctx, alice, defaultParams())
	require.NoError(t, c.Write(tctx, websocket.MessageText, []byte(`{"token":"0000"}`)))
	requireClosed(t, tctx, c, websocket.StatusPolicyViolation, "")
	bad := waitAudit(t, rec, events.AccessDenied, func(ev events.Event) bool { return ev.User == "" })
	require.Equal(t, "terminal", bad.Fields[events.FieldKind])
	require.NotEmpty(t, bad.Fields[events.FieldReason])
	require.NotEmpty(t, bad.Fields[events.FieldRemoteAddr])

	// Ambiguous: a second node1.
	const second = "1c9d7d7f-3e66-4a8d-8e5c-7b1d2a4cab02"
	other := newTestNode(t, e.auth, second, "node1")
	require.NoError(t, e.store.UpsertNode(ctx, services.Node{UUID: second, Hostname: "node1", Addr: other.addr(), Cluster: "c1", Expires: e.clock.Now().Add(time.Hour), LastHeartbeat: e.clock.Now()}))
	require.Eventually(t, func() bool {
		c := e.dialTerminal(t, tctx, alice, defaultParams())
		defer c.CloseNow()
		openTerminal(t, tctx, c, alice.token)
		_, msg, err := c.Read(tctx)
		require.NoError(t, err)
		fr, err := DecodeFrame(msg)
		require.NoError(t, err)
		return fr.Type == FrameError && strings.HasPrefix(string(fr.Payload), "ambiguous")
	}, testTimeout, 10*time.Millisecond)
	amb := waitAudit(t, rec, events.RouteAmbiguous, nil)
	require.Equal(t, testUser, amb.User)
	require.ElementsMatch(t, []string{testNodeUUID, second}, amb.Fields[events.FieldCandidates])
	require.Equal(t, "terminal", amb.Fields[events.FieldKind])
}
