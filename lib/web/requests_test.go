package web

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// loginAs opens a web session of user (password testPassword).
func (e *termEnv) loginAs(t *testing.T, user string) webSession {
	t.Helper()
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":%q,"password":%q,"otp_token":""}`, user, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var ws webSession
	for _, c := range resp.Cookies() {
		if c.Name == SessionCookieName {
			ws.cookie = c
		}
	}
	var out struct {
		Token string `json:"token"`
	}
	require.NoError(t, json.Unmarshal(body, &out))
	ws.token = out.Token
	return ws
}

// TestWebAccessRequests: the Requests page's API shows a reviewer the
// requests they may review and takes their verdict; the requester cannot
// approve their own; a user without review_requests gets 404, exactly as
// for a request that does not exist.
func TestWebAccessRequests(t *testing.T) {
	e := newTermEnv(t)
	e.server.cfg.WebSessions.AccessRequests = e.auth.UserAccessRequests()
	ctx := context.Background()
	for name, spec := range map[string]services.RoleSpec{
		"dba":       {Logins: []string{"dba"}},
		"requester": {Logins: []string{"{{internal.logins}}"}, Request: &services.RequestOption{Roles: []string{"dba"}}},
		"approver":  {Logins: []string{"{{internal.logins}}"}, ReviewRequests: &services.ReviewRequestsOption{Roles: []string{"dba"}}},
	} {
		require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: name}, Spec: spec}))
	}
	for name, role := range map[string]string{"rita": "requester", "rev": "approver"} {
		_, err := e.auth.CreateUser(ctx, name, []byte(testPassword), []string{name}, []string{role}, false)
		require.NoError(t, err)
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sp, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	ritaCert, err := e.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "rita", PublicKey: ssh.MarshalAuthorizedKey(sp), TTL: time.Hour})
	require.NoError(t, err)
	r, err := e.auth.UserAccessRequests().CreateAccessRequest(ctx, authapi.AccessRequestCreate{UserCert: ritaCert, Roles: []string{"dba"}, Reason: "incident"})
	require.NoError(t, err)

	list := func(ws webSession) []services.AccessRequest {
		resp, body := e.do(t, http.MethodGet, "/webapi/requests", "", ws, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		var out []services.AccessRequest
		require.NoError(t, json.Unmarshal(body, &out))
		return out
	}
	review := func(ws webSession, id, body string) (int, string) {
		resp, data := e.do(t, http.MethodPost, "/webapi/requests/"+id+"/review", body, ws, nil)
		return resp.StatusCode, string(data)
	}

	resp, _ := e.do(t, http.MethodGet, "/webapi/requests", "", webSession{}, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	alice := e.login(t) // the access role: no review_requests
	require.Empty(t, list(alice))
	resp, _ = e.do(t, http.MethodGet, "/webapi/requests/"+r.ID, "", alice, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	code, body := review(alice, r.ID, `{"state":"approved"}`)
	require.Equal(t, http.StatusNotFound, code, body)
	code, _ = review(alice, services.NewAccessRequestID(), `{"state":"approved"}`)
	require.Equal(t, http.StatusNotFound, code, "a missing request answers as one not visible")

	rita := e.loginAs(t, "rita")
	require.Len(t, list(rita), 1)
	code, body = review(rita, r.ID, `{"state":"approved"}`)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "your own")

	rev := e.loginAs(t, "rev")
	require.Equal(t, r.ID, list(rev)[0].ID)
	code, body = review(rev, r.ID, `{"state":"maybe"}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	code, body = review(rev, r.ID, `not json`)
	require.Equal(t, http.StatusBadRequest, code, body)
	code, body = review(rev, r.ID, `{"state":"approved","reason":"ok"}`)
	require.Equal(t, http.StatusOK, code, body)
	var got services.AccessRequest
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Equal(t, services.RequestApproved, got.State)
	require.Equal(t, "rev", got.Reviews[0].Reviewer)

	// The page itself is an app route.
	resp, _ = e.do(t, http.MethodGet, "/web/requests/"+r.ID, "", webSession{}, nil)
	require.NotEqual(t, http.StatusNotFound, resp.StatusCode)
}
