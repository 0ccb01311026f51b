package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// TestIssueSessionCert: a per-session certificate is issued only for a
// valid certificate of this cluster's user CA and a fresh TOTP code
// (spent once), for a node and login the roles allow; it lasts
// services.SessionMFATTL, its principals are the one login and it names
// the node; it cannot vouch for another one.
func TestIssueSessionCert(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	a := env.auth
	require.NoError(t, env.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: "strict"}, Spec: services.RoleSpec{
		Logins: []string{"root", "ops"}, NodeLabels: map[string]services.LabelValues{"env": {"prod"}}, RequireSessionMFA: true,
	}}))
	otpURL, err := a.CreateUser(ctx, "dora", []byte("dora password"), nil, []string{"strict"}, true)
	require.NoError(t, err)
	u, err := url.Parse(otpURL)
	require.NoError(t, err)
	secret := u.Query().Get("secret")
	node := services.Node{UUID: "11111111-1111-4111-8111-111111111111", Hostname: "db", Addr: "127.0.0.1:3022", Labels: map[string]string{"env": "prod"}, Cluster: testCluster, Expires: env.clock.Now().Add(time.Hour)}
	require.NoError(t, env.store.UpsertNode(ctx, node))

	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	login, err := a.GenerateUserCert(ctx, authapi.UserCertRequest{User: "dora", PublicKey: pub, TTL: time.Hour})
	require.NoError(t, err)
	code := func(at time.Time) string {
		c, err := totp.GenerateCode(secret, at)
		require.NoError(t, err)
		return c
	}
	req := authapi.SessionCertRequest{
		SessionMFAIdentity: authapi.SessionMFAIdentity{UserCert: login},
		PublicKey:          pub, Node: node.UUID, Cluster: testCluster, Login: "root", OTP: code(env.clock.Now()),
	}
	resp, err := a.IssueSessionCert(ctx, req)
	require.NoError(t, err)
	parsed, _, _, _, err := ssh.ParseAuthorizedKey(resp.Cert)
	require.NoError(t, err)
	cert := parsed.(*ssh.Certificate)
	require.Equal(t, []string{"root"}, cert.ValidPrincipals)
	require.Equal(t, env.clock.Now().Add(services.SessionMFATTL).Unix(), int64(cert.ValidBefore))
	var target services.SessionMFATarget
	require.NoError(t, json.Unmarshal([]byte(cert.Permissions.Extensions[services.CertExtensionSessionMFA]), &target))
	require.Equal(t, services.SessionMFATarget{Cluster: testCluster, Node: node.UUID, Login: "root"}, target)

	// The same code again: spent.
	_, err = a.IssueSessionCert(ctx, req)
	require.ErrorContains(t, err, "invalid credentials")

	next := code(env.clock.Now().Add(30 * time.Second))
	for name, mutate := range map[string]func(r *authapi.SessionCertRequest){
		"no factor":                      func(r *authapi.SessionCertRequest) { r.OTP = "" },
		"a login the roles do not grant": func(r *authapi.SessionCertRequest) { r.Login = "nobody" },
		"an unknown node":                func(r *authapi.SessionCertRequest) { r.Node = "22222222-2222-4222-8222-222222222222" },
		"another cluster":                func(r *authapi.SessionCertRequest) { r.Cluster = "leaf" },
		"a per-session certificate as the proof": func(r *authapi.SessionCertRequest) {
			r.UserCert = resp.Cert
		},
		"a certificate of another CA": func(r *authapi.SessionCertRequest) {
			// The login's certificate, signed again by a CA auth does
			// not know.
			p, _, _, _, err := ssh.ParseAuthorizedKey(login)
			require.NoError(t, err)
			forged := *p.(*ssh.Certificate)
			_, caPub, err := ed25519.GenerateKey(rand.Reader)
			require.NoError(t, err)
			ca, err := ssh.NewSignerFromKey(caPub)
			require.NoError(t, err)
			require.NoError(t, forged.SignCert(rand.Reader, ca))
			r.UserCert = ssh.MarshalAuthorizedKey(&forged)
		},
		"both identities": func(r *authapi.SessionCertRequest) {
			r.WebSession = &authapi.WebSessionRequest{SessionID: "x", Token: "y"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := req
			r.OTP = next
			mutate(&r)
			_, err := a.IssueSessionCert(ctx, r)
			require.Error(t, err)
		})
	}

	// An expired login certificate vouches for nothing.
	env.clock.Advance(2 * time.Hour)
	r := req
	r.OTP = code(env.clock.Now())
	_, err = a.IssueSessionCert(ctx, r)
	require.ErrorContains(t, err, "certificate refused")
}

// TestSessionMFABrowserLogin: psh ssh's confirmation in the browser is
// finished only by a web session of the user psh's certificate names,
// and only with a passkey's answer; a refusal spends nothing of another
// user's, and the request is single use.
func TestSessionMFABrowserLogin(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	a := env.auth
	require.NoError(t, env.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: "strict"}, Spec: services.RoleSpec{
		Logins: []string{"root"}, NodeLabels: map[string]services.LabelValues{"*": {"*"}}, RequireSessionMFA: true,
	}}))
	for _, u := range []string{"dora", "eve"} {
		_, err := a.CreateUser(ctx, u, []byte(u+" password"), nil, []string{"strict"}, false)
		require.NoError(t, err)
	}
	node := services.Node{UUID: "11111111-1111-4111-8111-111111111111", Hostname: "db", Addr: "127.0.0.1:3022", Cluster: testCluster, Expires: env.clock.Now().Add(time.Hour)}
	require.NoError(t, env.store.UpsertNode(ctx, node))
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	doraCert, err := a.GenerateUserCert(ctx, authapi.UserCertRequest{User: "dora", PublicKey: pub, TTL: time.Hour})
	require.NoError(t, err)
	seal := make([]byte, 32)
	started, err := a.CreateSessionMFALogin(ctx, authapi.SessionMFALoginRequest{
		SessionMFAIdentity: authapi.SessionMFAIdentity{UserCert: doraCert},
		Client:             authapi.SSOClientLogin{PublicKey: pub, RedirectURL: "http://127.0.0.1:40000/callback", SealKey: seal},
		Node:               node.UUID, Cluster: testCluster, Login: "root",
	})
	require.NoError(t, err)
	session := func(user, sid string) authapi.WebSessionRequest {
		token := sid + "-token"
		th := sha256.Sum256([]byte(token))
		require.NoError(t, a.createWebSessionRecord(ctx, user, &authapi.WebSessionInit{Key: webSessionKeyOf(sid), TokenHash: th[:]}, env.clock.Now().Add(time.Hour), false))
		return authapi.WebSessionRequest{SessionID: sid, Token: token}
	}
	// Eve's session: not hers to confirm.
	_, err = a.FinishCLILogin(ctx, authapi.CLILoginFinishRequest{WebSessionRequest: session("eve", "eve-session"), ID: started.ID, ChallengeID: "x"})
	require.ErrorContains(t, err, "belongs to another user")
	// Dora's, without a passkey answer: refused, and the request is spent.
	dora := session("dora", "dora-session")
	_, err = a.FinishCLILogin(ctx, authapi.CLILoginFinishRequest{WebSessionRequest: dora, ID: started.ID})
	require.Error(t, err)
	_, err = a.FinishCLILogin(ctx, authapi.CLILoginFinishRequest{WebSessionRequest: dora, ID: started.ID})
	require.ErrorContains(t, err, MsgCLILoginGone)
	// psh names the user by a certificate, never by a web session.
	_, err = a.CreateSessionMFALogin(ctx, authapi.SessionMFALoginRequest{SessionMFAIdentity: authapi.SessionMFAIdentity{WebSession: &dora}})
	require.Error(t, err)
}
