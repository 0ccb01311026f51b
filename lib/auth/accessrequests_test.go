package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/events/export"
	"github.com/postern-dev/postern/lib/services"
)

// requestEnv is an auth API with roles and users for access requests:
// alice and carol (dev) may request dba, bob and dave (approver) review
// dba requests, erin (ops) may request ops with two approvals.
type requestEnv struct {
	*testEnv
	rec   *events.Recorder
	proxy *Client
	admin *Client
	certs map[string][]byte
}

func newRequestEnv(t *testing.T) *requestEnv {
	t.Helper()
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	role := func(name string, spec services.RoleSpec) {
		require.NoError(t, env.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: name}, Spec: spec}))
	}
	all := map[string]services.LabelValues{"*": {"*"}}
	role("dba", services.RoleSpec{Logins: []string{"dba"}, NodeLabels: map[string]services.LabelValues{"env": {"prod"}}})
	role("ops", services.RoleSpec{Logins: []string{"ops"}, NodeLabels: all})
	role("dev", services.RoleSpec{Logins: []string{"{{internal.logins}}"}, NodeLabels: map[string]services.LabelValues{"env": {"dev"}},
		Request: &services.RequestOption{Roles: []string{"dba"}, MaxTTL: services.Duration(2 * time.Hour)}})
	role("opsreq", services.RoleSpec{Logins: []string{"{{internal.logins}}"}, Request: &services.RequestOption{Roles: []string{"ops"}, Thresholds: 2}})
	role("approver", services.RoleSpec{Logins: []string{"{{internal.logins}}"}, ReviewRequests: &services.ReviewRequestsOption{Roles: []string{"dba", "ops"}}})
	e := &requestEnv{testEnv: env, rec: rec, proxy: env.client(t, env.identity(t, "proxy-1", RoleProxy)), admin: env.adminClient(t), certs: map[string][]byte{}}
	for name, roles := range map[string][]string{
		"alice": {"dev"}, "carol": {"dev"}, "bob": {"approver"}, "dave": {"approver"}, "erin": {"opsreq"}, "frank": {"approver", "dev"},
	} {
		_, err := env.auth.CreateUser(ctx, name, []byte("pw"), []string{name}, roles, false)
		require.NoError(t, err)
		e.certs[name] = e.userCert(t, name)
	}
	return e
}

func testPublicKey(t *testing.T) []byte {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sp, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return ssh.MarshalAuthorizedKey(sp)
}

func (e *requestEnv) userCert(t *testing.T, user string) []byte {
	t.Helper()
	cert, err := e.auth.GenerateUserCert(context.Background(), authapi.UserCertRequest{User: user, PublicKey: testPublicKey(t), TTL: 8 * time.Hour})
	require.NoError(t, err)
	return cert
}

func (e *requestEnv) create(t *testing.T, user string, roles ...string) *services.AccessRequest {
	t.Helper()
	r, err := e.proxy.CreateAccessRequest(context.Background(), authapi.AccessRequestCreate{UserCert: e.certs[user], Roles: roles, Reason: "incident 42", TTL: services.Duration(10 * time.Hour)})
	require.NoError(t, err)
	return r
}

func (e *requestEnv) review(user, id, state string) (*services.AccessRequest, error) {
	return e.proxy.ReviewAccessRequest(context.Background(), authapi.AccessRequestReview{UserCert: e.certs[user], ID: id, State: state, Reason: "ok"})
}

func (e *requestEnv) cert(user, id string) (*ssh.Certificate, error) {
	data, err := e.proxy.AccessRequestCert(context.Background(), authapi.AccessRequestCert{UserCert: e.certs[user], ID: id, PublicKey: certKey(e.certs[user])})
	if err != nil {
		return nil, err
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(data)
	if err != nil {
		return nil, err
	}
	return pub.(*ssh.Certificate), nil
}

// certKey is the key a certificate (authorized_keys format) certifies.
func certKey(cert []byte) []byte {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(cert)
	if err != nil {
		return nil
	}
	return ssh.MarshalAuthorizedKey(pub.(*ssh.Certificate).Key)
}

func ids(rs []services.AccessRequest) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

// TestAccessRequestLifecycle: create (ttl capped), who sees it, who may
// review it, approval, the certificate it yields, and a deny that locks.
func TestAccessRequestLifecycle(t *testing.T) {
	e := newRequestEnv(t)
	ctx := context.Background()
	r := e.create(t, "alice", "dba")
	require.Equal(t, services.RequestPending, r.State)
	require.Equal(t, e.clock.Now().Add(2*time.Hour).Unix(), r.Expires.Unix(), "ttl is capped by max_ttl")
	waitEvent(t, e.rec, events.AccessRequestCreate, func(ev events.Event) bool { return ev.Fields[events.FieldRequestID] == r.ID })

	// Visibility: own and reviewable only; others get not found.
	for user, want := range map[string]bool{"alice": true, "bob": true, "carol": false, "erin": false} {
		list, err := e.proxy.ListAccessRequests(ctx, e.certs[user])
		require.NoError(t, err)
		require.Equal(t, want, len(list) == 1, user)
		_, err = e.proxy.GetAccessRequest(ctx, e.certs[user], r.ID)
		if want {
			require.NoError(t, err, user)
		} else {
			require.True(t, trace.IsNotFound(err), "%s: %v", user, err)
		}
	}
	list, err := e.admin.ListAccessRequests(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, []string{r.ID}, ids(list))

	// No certificate before approval.
	_, err = e.cert("alice", r.ID)
	requireKind(t, err, trace.IsAccessDenied, "not approved")

	// Self-approval and a reviewer without review_requests.
	_, err = e.review("alice", r.ID, services.RequestApproved)
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	_, err = e.review("carol", r.ID, services.RequestApproved)
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = e.review("erin", r.ID, services.RequestApproved)
	require.True(t, trace.IsNotFound(err), "%v", err)

	got, err := e.review("bob", r.ID, services.RequestApproved)
	require.NoError(t, err)
	require.Equal(t, services.RequestApproved, got.State)

	cert, err := e.cert("alice", r.ID)
	require.NoError(t, err)
	require.Equal(t, r.ID, cert.Permissions.Extensions[services.CertExtensionRequestID])
	var roles []string
	require.NoError(t, json.Unmarshal([]byte(cert.Permissions.Extensions[services.CertExtensionRoles]), &roles))
	require.ElementsMatch(t, []string{"dev", "dba"}, roles)
	require.Contains(t, cert.ValidPrincipals, "dba")
	require.LessOrEqual(t, cert.ValidBefore, uint64(r.Expires.Unix()), "the certificate never outlives the request")

	// Another user's request id, a forged one.
	_, err = e.cert("carol", r.ID)
	requireKind(t, err, trace.IsAccessDenied, "not an approved request of yours")
	_, err = e.cert("alice", services.NewAccessRequestID())
	requireKind(t, err, trace.IsAccessDenied, "not an approved request of yours")
	// A key other than the asking certificate's: what a proxy that saw
	// alice's certificate would ask for.
	_, err = e.proxy.AccessRequestCert(ctx, authapi.AccessRequestCert{UserCert: e.certs["alice"], ID: r.ID, PublicKey: testPublicKey(t)})
	requireKind(t, err, trace.IsAccessDenied, "for the key of the certificate")
	// A certificate not of this cluster's user CA.
	_, err = e.proxy.AccessRequestCert(ctx, authapi.AccessRequestCert{UserCert: forgedUserCert(t, "alice"), ID: r.ID, PublicKey: testPublicKey(t)})
	requireKind(t, err, trace.IsAccessDenied, "user CA")

	// A deny of the approved request ends its grant: a lock on its id.
	_, err = e.review("dave", r.ID, services.RequestDenied)
	require.NoError(t, err)
	lk, err := e.store.GetLock(ctx, services.LockTarget{AccessRequest: r.ID})
	require.NoError(t, err)
	require.Contains(t, lk.Refusal(), r.ID)
	_, err = e.cert("alice", r.ID)
	requireKind(t, err, trace.IsAccessDenied, "denied")
	// The certificate of the ended grant speaks for nobody.
	_, err = e.proxy.ListAccessRequests(ctx, ssh.MarshalAuthorizedKey(cert))
	requireKind(t, err, trace.IsAccessDenied, "access request "+r.ID)
	waitEvent(t, e.rec, events.AccessRequestReview, func(ev events.Event) bool {
		return ev.Fields[events.FieldRequestID] == r.ID && ev.Fields[fieldState] == services.RequestDenied
	})
}

// forgedUserCert is a well-formed user certificate of another CA.
func forgedUserCert(t *testing.T, user string) []byte {
	t.Helper()
	_, caKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(caKey)
	require.NoError(t, err)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sp, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	cert := &ssh.Certificate{Key: sp, CertType: ssh.UserCert, KeyId: user, ValidPrincipals: []string{user},
		ValidBefore: ssh.CertTimeInfinity, Permissions: ssh.Permissions{Extensions: map[string]string{services.CertExtensionUser: user, services.CertExtensionRoles: `["dba"]`}}}
	require.NoError(t, cert.SignCert(rand.Reader, signer))
	return ssh.MarshalAuthorizedKey(cert)
}

// TestAccessRequestRefusals: a role not requestable, an admin creating.
func TestAccessRequestRefusals(t *testing.T) {
	e := newRequestEnv(t)
	ctx := context.Background()
	_, err := e.proxy.CreateAccessRequest(ctx, authapi.AccessRequestCreate{UserCert: e.certs["alice"], Roles: []string{"ops"}})
	requireKind(t, err, trace.IsAccessDenied, "do not allow requesting role(s) ops")
	_, err = e.proxy.CreateAccessRequest(ctx, authapi.AccessRequestCreate{UserCert: e.certs["bob"], Roles: []string{"dba"}})
	requireKind(t, err, trace.IsAccessDenied, "dba")
	_, err = e.proxy.CreateAccessRequest(ctx, authapi.AccessRequestCreate{UserCert: e.certs["alice"]})
	requireKind(t, err, trace.IsBadParameter, "--roles")
	_, err = e.proxy.CreateAccessRequest(ctx, authapi.AccessRequestCreate{UserCert: e.certs["alice"], Roles: []string{"dba"}, Reason: "a\x1b[2J"})
	requireKind(t, err, trace.IsBadParameter, "control character")
	list, err := e.admin.ListAccessRequests(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, list)
}

// TestAccessRequestThresholds: two approvals from two reviewers; the same
// reviewer twice counts once; a user holding both dev and approver cannot
// approve their own.
func TestAccessRequestThresholds(t *testing.T) {
	e := newRequestEnv(t)
	r := e.create(t, "erin", "ops")
	require.Equal(t, 2, r.Thresholds)
	got, err := e.review("bob", r.ID, services.RequestApproved)
	require.NoError(t, err)
	require.Equal(t, services.RequestPending, got.State)
	_, err = e.review("bob", r.ID, services.RequestApproved)
	requireKind(t, err, trace.IsBadParameter, "already reviewed")
	_, err = e.cert("erin", r.ID)
	require.True(t, trace.IsAccessDenied(err))
	got, err = e.review("dave", r.ID, services.RequestApproved)
	require.NoError(t, err)
	require.Equal(t, services.RequestApproved, got.State)
	_, err = e.cert("erin", r.ID)
	require.NoError(t, err)

	own := e.create(t, "frank", "dba")
	_, err = e.review("frank", own.ID, services.RequestApproved)
	requireKind(t, err, trace.IsAccessDenied, "your own")
}

// TestAccessRequestExpiry: the sweep on auth's clock marks an approved
// request expired, locks its grant and audits it.
func TestAccessRequestExpiry(t *testing.T) {
	e := newRequestEnv(t)
	ctx := context.Background()
	r := e.create(t, "alice", "dba")
	_, err := e.review("bob", r.ID, services.RequestApproved)
	require.NoError(t, err)
	pending := e.create(t, "carol", "dba")

	require.NoError(t, e.auth.ExpireAccessRequests(ctx))
	_, err = e.store.GetLock(ctx, services.LockTarget{AccessRequest: r.ID})
	require.True(t, trace.IsNotFound(err), "no lock before expiry")

	e.clock.Advance(2*time.Hour + time.Second)
	require.NoError(t, e.auth.ExpireAccessRequests(ctx))
	for _, id := range []string{r.ID, pending.ID} {
		got, _, err := e.store.GetAccessRequest(ctx, id)
		require.NoError(t, err)
		require.Equal(t, services.RequestExpired, got.State)
	}
	_, err = e.store.GetLock(ctx, services.LockTarget{AccessRequest: r.ID})
	require.NoError(t, err)
	waitEvent(t, e.rec, events.AccessRequestExpire, func(ev events.Event) bool { return ev.Fields[events.FieldRequestID] == r.ID })
	_, err = e.review("bob", pending.ID, services.RequestApproved)
	requireKind(t, err, trace.IsBadParameter, "expired")
}

// TestAccessRequestWebhook: every state change reaches the
// access_requests webhook as a JSON line naming the step and the request.
func TestAccessRequestWebhook(t *testing.T) {
	e := newRequestEnv(t)
	got := make(chan RequestNotification, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
			var n RequestNotification
			if json.Unmarshal([]byte(line), &n) == nil {
				got <- n
			}
		}
	}))
	defer srv.Close()
	w, err := export.NewWebhook(export.Config{Webhook: srv.URL})
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close(context.Background())) }()
	e.auth.cfg.RequestNotifier = w

	r := e.create(t, "alice", "dba")
	_, err = e.review("bob", r.ID, services.RequestApproved)
	require.NoError(t, err)
	for _, want := range []struct{ event, by, state string }{
		{events.AccessRequestCreate, "alice", services.RequestPending},
		{events.AccessRequestReview, "bob", services.RequestApproved},
	} {
		select {
		case n := <-got:
			require.Equal(t, want.event, n.Event)
			require.Equal(t, want.by, n.By)
			require.Equal(t, r.ID, n.Request.ID)
			require.Equal(t, want.state, n.Request.State)
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s notification", want.event)
		}
	}
}
