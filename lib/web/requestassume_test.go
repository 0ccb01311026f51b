package web

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/services"
)

// TestWebAssumeAccessRequest: a requester assumes their approved request
// in the browser, sees and reaches the node it grants, and a deny ends the
// terminal opened with it while the session goes on with its own roles.
// Nobody assumes another user's request, a pending one or one that does
// not exist.
func TestWebAssumeAccessRequest(t *testing.T) {
	e, locks := newLockedTermEnv(t)
	e.server.cfg.WebSessions.AccessRequests = e.auth.UserAccessRequests()
	ctx := context.Background()
	for name, spec := range map[string]services.RoleSpec{
		"dba":       {Logins: []string{"{{internal.logins}}"}, NodeLabels: map[string]services.LabelValues{"env": {"dev"}}},
		"requester": {Logins: []string{"{{internal.logins}}"}, Request: &services.RequestOption{Roles: []string{"dba"}}},
		"approver":  {Logins: []string{"{{internal.logins}}"}, ReviewRequests: &services.ReviewRequestsOption{Roles: []string{"dba"}}},
	} {
		require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: name}, Spec: spec}))
	}
	for name, role := range map[string]string{"rita": "requester", "rev": "approver"} {
		_, err := e.auth.CreateUser(ctx, name, []byte(testPassword), []string{name}, []string{role}, false)
		require.NoError(t, err)
	}
	rita, rev, alice := e.loginAs(t, "rita"), e.loginAs(t, "rev"), e.login(t)

	nodes := func(ws webSession) []string {
		resp, body := e.do(t, http.MethodGet, "/webapi/nodes", "", ws, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		var out webapi.NodesResponse
		require.NoError(t, json.Unmarshal(body, &out))
		var names []string
		for _, n := range out.Items {
			names = append(names, n.Hostname)
		}
		return names
	}
	assumed := func(ws webSession) AssumedRequest {
		resp, body := e.do(t, http.MethodGet, "/webapi/requests/assumed", "", ws, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		var out AssumedRequest
		require.NoError(t, json.Unmarshal(body, &out))
		return out
	}
	assume := func(ws webSession, id string) (int, string) {
		resp, body := e.do(t, http.MethodPost, "/webapi/requests/"+id+"/assume", "", ws, nil)
		return resp.StatusCode, string(body)
	}
	request := func(ttl time.Duration) string {
		// Requests are made with psh; here straight through auth, with a
		// certificate of rita's.
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		sp, err := ssh.NewPublicKey(pub)
		require.NoError(t, err)
		cert, err := e.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "rita", PublicKey: ssh.MarshalAuthorizedKey(sp), TTL: time.Hour})
		require.NoError(t, err)
		r, err := e.auth.UserAccessRequests().CreateAccessRequest(ctx, authapi.AccessRequestCreate{UserCert: cert, Roles: []string{"dba"}, TTL: services.Duration(ttl)})
		require.NoError(t, err)
		return r.ID
	}
	reviewAs := func(ws webSession, id, state string) {
		resp, body := e.do(t, http.MethodPost, "/webapi/requests/"+id+"/review", `{"state":"`+state+`"}`, ws, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	}

	require.Empty(t, nodes(rita), "without the request rita reaches nothing")
	id := request(0)

	// Pending: nothing to assume.
	code, body := assume(rita, id)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "not approved")
	reviewAs(rev, id, services.RequestApproved)

	// Another user's approved request, and one that does not exist: the
	// same refusal, and nothing changes for them.
	for _, ws := range []webSession{rev, alice} {
		code, body = assume(ws, id)
		require.Equal(t, http.StatusForbidden, code, body)
		require.Empty(t, assumed(ws).RequestID)
	}
	code, body = assume(rita, services.NewAccessRequestID())
	require.Equal(t, http.StatusForbidden, code, body)
	require.Empty(t, nodes(rita))

	code, body = assume(rita, id)
	require.Equal(t, http.StatusOK, code, body)
	got := assumed(rita)
	require.Equal(t, id, got.RequestID)
	require.Equal(t, []string{"dba"}, got.Roles)
	r, _, err := e.store.GetAccessRequest(ctx, id)
	require.NoError(t, err)
	require.False(t, got.Expires.After(r.Expires), "the grant never outlives the request")
	require.Equal(t, []string{"node1"}, nodes(rita))

	tctx := testCtx(t)
	params := defaultParams()
	params.Login = "rita"
	c := e.dialTerminal(t, tctx, rita, params)
	openTerminal(t, tctx, c, rita.token)
	readUntil(t, tctx, c, FrameData, "prompt$ ")

	// The deny locks the request: the terminal opened with it ends, the
	// session goes on with rita's own roles.
	changed := locks.Changes()
	reviewAs(rev, id, services.RequestDenied)
	select {
	case <-changed:
	case <-time.After(testTimeout):
		t.Fatal("the deny's lock never arrived")
	}
	f := readUntil(t, tctx, c, FrameError, "")
	require.Contains(t, string(f.Payload), "denied")
	require.Empty(t, assumed(rita).RequestID)
	require.Empty(t, nodes(rita))
	code, body = assume(rita, id)
	require.Equal(t, http.StatusForbidden, code, body)

	// Drop: back to the own roles at once.
	id2 := request(0)
	reviewAs(rev, id2, services.RequestApproved)
	code, body = assume(rita, id2)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []string{"node1"}, nodes(rita))
	resp, data := e.do(t, http.MethodDelete, "/webapi/requests/assumed", "", rita, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(data))
	require.Empty(t, assumed(rita).RequestID)
	require.Empty(t, nodes(rita))

	// The request's expiry (auth's sweep locks its id) ends the grant as
	// a deny does.
	id3 := request(time.Minute)
	reviewAs(rev, id3, services.RequestApproved)
	code, body = assume(rita, id3)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []string{"node1"}, nodes(rita))
	c = e.dialTerminal(t, tctx, rita, params)
	openTerminal(t, tctx, c, rita.token)
	readUntil(t, tctx, c, FrameData, "prompt$ ")
	e.clock.Advance(time.Minute)
	changed = locks.Changes()
	require.NoError(t, e.auth.ExpireAccessRequests(ctx))
	select {
	case <-changed:
	case <-time.After(testTimeout):
		t.Fatal("the expiry's lock never arrived")
	}
	f = readUntil(t, tctx, c, FrameError, "")
	require.Contains(t, string(f.Payload), "expired")
	require.Empty(t, assumed(rita).RequestID)
	require.Empty(t, nodes(rita))

	// Logging out ends the session whatever it assumed.
	code, body = assume(rita, id2)
	require.Equal(t, http.StatusOK, code, body)
	resp, data = e.do(t, http.MethodDelete, "/webapi/sessions", "", rita, nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, string(data))
	resp, _ = e.do(t, http.MethodGet, "/webapi/nodes", "", rita, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}
