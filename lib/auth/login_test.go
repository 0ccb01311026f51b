package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

func issuedIdentity(t *testing.T, resp *authapi.SSHLoginResponse) *authz.Identity {
	t.Helper()
	pub, _, _, _, err := ssh.ParseAuthorizedKey(resp.Cert)
	require.NoError(t, err)
	id, err := authz.FromCertificate(pub.(*ssh.Certificate), "")
	require.NoError(t, err)
	return id
}

// TestCompleteLoginFromAnyConnector: issuance takes what a connector
// proved (user, roles, traits, expiry) and nothing else: a login result
// from a connector that keeps no user record (as an identity provider's)
// gets a certificate with exactly its roles and traits, capped by its
// expiry, with a web session of the certificate's lifetime; locks and
// max_session_ttl apply as for a local user.
func TestCompleteLoginFromAnyConnector(t *testing.T) {
	e := newTestAuth(t)
	ctx := context.Background()
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	now := e.clock.Now()

	res := &LoginResult{
		User: "carol@example.com", Connector: "oidc:corp",
		Roles:  []string{"access"},
		Traits: map[string][]string{services.TraitLogins: {"carol"}, "groups": {"dev"}},
	}
	key := sha256.Sum256([]byte("session id"))
	tokenHash := sha256.Sum256([]byte("token"))
	resp, err := e.auth.completeLogin(ctx, res, LoginOutput{
		PublicKey:  pub,
		WebSession: &authapi.WebSessionInit{Key: hex.EncodeToString(key[:]), TokenHash: tokenHash[:]},
	})
	require.NoError(t, err)
	require.Equal(t, "carol@example.com", resp.Username)
	require.NotEmpty(t, resp.HostSigners)
	id := issuedIdentity(t, resp)
	require.Equal(t, "carol@example.com", id.User)
	require.Equal(t, []string{"access"}, id.Roles)
	require.Equal(t, res.Traits, id.Traits)
	require.Equal(t, []string{"carol"}, id.Cert.ValidPrincipals, "the access role's {{internal.logins}} from the result's traits")
	require.Equal(t, uint64(now.Add(services.DefaultMaxSessionTTL).Unix()), id.Cert.ValidBefore, "no expiry: the roles decide")
	ws, err := e.store.GetWebSession(ctx, hex.EncodeToString(key[:]))
	require.NoError(t, err)
	require.Equal(t, "carol@example.com", ws.User)
	require.True(t, time.Unix(int64(id.Cert.ValidBefore), 0).Equal(ws.Expires), "the web session ends with its certificate")

	t.Run("expiry caps the certificate", func(t *testing.T) {
		r := *res
		r.Expires = now.Add(20 * time.Minute)
		resp, err := e.auth.completeLogin(ctx, &r, LoginOutput{PublicKey: pub, TTL: time.Hour})
		require.NoError(t, err)
		require.Equal(t, uint64(r.Expires.Unix()), issuedIdentity(t, resp).Cert.ValidBefore)
		// A shorter asked TTL still wins.
		resp, err = e.auth.completeLogin(ctx, &r, LoginOutput{PublicKey: pub, TTL: 5 * time.Minute})
		require.NoError(t, err)
		require.Equal(t, uint64(now.Add(5*time.Minute).Unix()), issuedIdentity(t, resp).Cert.ValidBefore)
	})

	t.Run("an expired login issues nothing", func(t *testing.T) {
		r := *res
		r.Expires = now.Add(-time.Second)
		_, err := e.auth.completeLogin(ctx, &r, LoginOutput{PublicKey: pub})
		require.True(t, trace.IsAccessDenied(err), "%v", err)
	})

	t.Run("a lock applies whatever the connector", func(t *testing.T) {
		_, err := e.auth.UpsertLock(ctx, authapi.LockRequest{Target: services.LockTarget{User: res.User}, Message: "offboarded"}, "admin")
		require.NoError(t, err)
		_, err = e.auth.completeLogin(ctx, res, LoginOutput{PublicKey: pub})
		require.True(t, services.IsLocked(err), "%v", err)
		require.NoError(t, e.auth.DeleteLock(ctx, services.LockTarget{User: res.User}))
	})

	t.Run("no user, no certificate", func(t *testing.T) {
		_, err := e.auth.completeLogin(ctx, &LoginResult{Roles: []string{"admin"}}, LoginOutput{PublicKey: pub})
		require.True(t, trace.IsBadParameter(err), "%v", err)
	})
}

// TestLocalConnectorResult: the local connector's result is the stored
// user's roles and traits, and its failures are one answer.
func TestLocalConnectorResult(t *testing.T) {
	e := newTestAuth(t)
	ctx := context.Background()
	_, err := e.auth.CreateUser(ctx, "dave", []byte("dave's password"), []string{"dave", "ops"}, []string{"access"}, false)
	require.NoError(t, err)
	res, err := e.auth.local.Authenticate(ctx, authapi.AuthRequest{User: "dave", Password: "dave's password", RemoteAddr: "192.0.2.1:5"})
	require.NoError(t, err)
	require.Equal(t, &LoginResult{User: "dave", Connector: ConnectorLocal, Roles: []string{"access"},
		Traits: map[string][]string{services.TraitLogins: {"dave", "ops"}}}, res)
	_, err = e.auth.local.Authenticate(ctx, authapi.AuthRequest{User: "dave", Password: "wrong", RemoteAddr: "192.0.2.1:5"})
	require.True(t, trace.IsAccessDenied(err))
	require.Equal(t, "invalid credentials", trace.UserMessage(err))
}

// TestLockoutNamesItsWait: the limiter's refusal carries its wait as data
// (authapi.RetryAfterError), in process and through the API client.
func TestLockoutNamesItsWait(t *testing.T) {
	e := newTestAPI(t)
	ctx := context.Background()
	_, err := e.auth.CreateUser(ctx, "erin", []byte("erin's password"), []string{"erin"}, nil, false)
	require.NoError(t, err)
	req := authapi.AuthRequest{User: "erin", Password: "wrong", RemoteAddr: "192.0.2.9:1"}
	for {
		_, err = e.auth.AuthenticateUser(ctx, req)
		if trace.IsLimitExceeded(err) {
			break
		}
		require.True(t, trace.IsAccessDenied(err), "%v", err)
	}
	wait, ok := authapi.RetryAfterOf(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, DefaultLoginWindow, wait)

	// A proxy asking over the API gets the same wait back as data.
	proxy := e.client(t, e.identity(t, "proxy-1", RoleProxy))
	_, err = proxy.AuthenticateUser(ctx, req)
	require.True(t, trace.IsLimitExceeded(err), "%v", err)
	wait, ok = authapi.RetryAfterOf(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, DefaultLoginWindow, wait)
}
