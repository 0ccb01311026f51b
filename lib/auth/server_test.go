package auth

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/pquerna/otp/totp"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

func TestFirstStartCreatesCAsAndRolesAndRestartReuses(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()

	for _, typ := range []services.CertAuthType{services.UserCA, services.HostCA} {
		ca, err := env.store.GetCertAuthority(ctx, testCluster, typ, true)
		require.NoError(t, err)
		require.Len(t, ca.SSHPublicKeys, 1)
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(ca.SSHPublicKeys[0]))
		require.NoError(t, err)
		require.Equal(t, ssh.KeyAlgoED25519, pub.Type())
		if typ == services.HostCA {
			cert, err := parseCertPEM(ca.TLSCert)
			require.NoError(t, err)
			require.True(t, cert.IsCA)
			require.WithinDuration(t, env.clock.Now().Add(TLSCAValidity), cert.NotAfter, time.Minute)
		} else {
			require.Empty(t, ca.TLSCert)
		}
	}
	for _, name := range []string{services.PresetAccessRole, services.PresetAdminRole} {
		_, err := env.store.GetRole(ctx, name)
		require.NoError(t, err)
	}
	adminID, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	require.Equal(t, RoleAdmin, adminID.Role)
	require.Equal(t, testCluster, adminID.ClusterName)

	// An operator's edit of a preset role survives a restart.
	access, err := env.store.GetRole(ctx, services.PresetAccessRole)
	require.NoError(t, err)
	access.Spec.Logins = []string{"edited"}
	require.NoError(t, env.store.UpsertRole(ctx, access))

	again, err := NewServer(ServerConfig{
		Store: env.store, ClusterName: testCluster, AdminIdentityDir: env.adminDir,
		BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: env.clock, Logger: testLogger()},
	})
	require.NoError(t, err)
	require.Equal(t, env.auth.UserCAKeys(), again.UserCAKeys())
	require.Equal(t, env.auth.HostCAKeys(), again.HostCAKeys())
	require.Equal(t, env.auth.CAPin(), again.CAPin())
	access, err = env.store.GetRole(ctx, services.PresetAccessRole)
	require.NoError(t, err)
	require.Equal(t, []string{"edited"}, access.Spec.Logins)
	// The admin identity was still valid: it is kept, not rewritten.
	adminAgain, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	require.Equal(t, adminID.Files.TLSCert, adminAgain.Files.TLSCert)
}

func TestConcurrentFirstStartsAgreeOnOneCA(t *testing.T) {
	clock := clockwork.NewFakeClock()
	store := newTestStore(t, clock)
	const n = 4
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			servers[i], errs[i] = NewServer(ServerConfig{Store: store, ClusterName: testCluster, BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Logger: testLogger()}})
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, servers[0].UserCAKeys(), servers[i].UserCAKeys())
		require.Equal(t, servers[0].HostCAKeys(), servers[i].HostCAKeys())
		require.Equal(t, servers[0].CAPin(), servers[i].CAPin())
	}
}

func parseSSHCert(t *testing.T, data []byte) *ssh.Certificate {
	t.Helper()
	pub, _, _, _, err := ssh.ParseAuthorizedKey(data)
	require.NoError(t, err)
	cert, ok := pub.(*ssh.Certificate)
	require.True(t, ok)
	return cert
}

func TestUserCert(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	require.NoError(t, env.store.UpsertRole(ctx, &services.Role{
		Metadata: services.Metadata{Name: "short"},
		Spec: services.RoleSpec{
			Logins:        []string{"deploy"},
			NodeLabels:    map[string]services.LabelValues{"env": {"prod"}},
			MaxSessionTTL: services.Duration(time.Hour),
		},
	}))
	_, err := env.auth.CreateUser(ctx, "alice", []byte("secret-pw"), []string{"root", "alice"}, []string{"access", "short"}, false)
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)

	// Asking for more than max_session_ttl gets the cap.
	certBytes, err := env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "alice", PublicKey: pub, TTL: 5 * time.Hour})
	require.NoError(t, err)
	cert := parseSSHCert(t, certBytes)
	now := env.clock.Now()
	require.Equal(t, uint32(ssh.UserCert), cert.CertType)
	require.Equal(t, "alice", cert.KeyId)
	require.Equal(t, []string{"alice", "deploy", "root"}, cert.ValidPrincipals)
	require.Equal(t, uint64(now.Add(-time.Minute).Unix()), cert.ValidAfter)
	require.Equal(t, uint64(now.Add(time.Hour).Unix()), cert.ValidBefore)
	ext := cert.Permissions.Extensions
	for _, k := range []string{"permit-pty", "permit-port-forwarding", "permit-agent-forwarding"} {
		require.Contains(t, ext, k)
	}
	require.NotContains(t, ext, "permit-X11-forwarding")
	require.Equal(t, "alice", ext[services.CertExtensionUser])
	require.JSONEq(t, `["access","short"]`, ext[services.CertExtensionRoles])
	require.JSONEq(t, `{"logins":["root","alice"]}`, ext[services.CertExtensionTraits])
	require.Equal(t, testCluster, ext[services.CertExtensionCluster])
	// Signed by the user CA.
	caPub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(env.auth.UserCAKeys()[0]))
	require.NoError(t, err)
	require.Equal(t, caPub.Marshal(), cert.SignatureKey.Marshal())
	checker := ssh.CertChecker{Clock: env.clock.Now}
	require.NoError(t, checker.CheckCert("root", cert))
	require.Error(t, checker.CheckCert("mallory", cert))

	// The forwarding permits follow the roles: "short" grants neither.
	_, err = env.auth.CreateUser(ctx, "bob", []byte("secret-pw"), nil, []string{"short"}, false)
	require.NoError(t, err)
	certBytes, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "bob", PublicKey: pub})
	require.NoError(t, err)
	bobCert := parseSSHCert(t, certBytes)
	require.Equal(t, []string{"deploy"}, bobCert.ValidPrincipals)
	require.Contains(t, bobCert.Permissions.Extensions, "permit-pty")
	require.NotContains(t, bobCert.Permissions.Extensions, "permit-port-forwarding")
	require.NotContains(t, bobCert.Permissions.Extensions, "permit-agent-forwarding")

	// A shorter request is honoured.
	certBytes, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "alice", PublicKey: pub, TTL: 10 * time.Minute})
	require.NoError(t, err)
	require.Equal(t, uint64(now.Add(10*time.Minute).Unix()), parseSSHCert(t, certBytes).ValidBefore)
	// Zero means the cap.
	certBytes, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "alice", PublicKey: pub})
	require.NoError(t, err)
	require.Equal(t, uint64(now.Add(time.Hour).Unix()), parseSSHCert(t, certBytes).ValidBefore)

	// No logins: a clear error, no certificate.
	_, err = env.auth.CreateUser(ctx, "nologin", []byte("pw"), nil, nil, false)
	require.NoError(t, err)
	_, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "nologin", PublicKey: pub})
	requireKind(t, err, trace.IsBadParameter, `user "nologin" has no logins`)

	_, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "ghost", PublicKey: pub})
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "alice", PublicKey: []byte("garbage")})
	require.True(t, trace.IsBadParameter(err), "%v", err)
}

func TestHostCert(t *testing.T) {
	env := newTestAuth(t)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	certBytes, err := env.auth.GenerateHostCert(context.Background(), HostCertRequest{
		PublicKey: pub, UUID: "1b2c", Hostname: "web1", Principals: []string{"10.0.0.5", "10.0.0.5:3022"}, Role: RoleNode,
	})
	require.NoError(t, err)
	cert := parseSSHCert(t, certBytes)
	require.Equal(t, uint32(ssh.HostCert), cert.CertType)
	require.Equal(t, "1b2c", cert.KeyId)
	require.Equal(t, []string{"1b2c", "web1", "1b2c." + testCluster, "web1." + testCluster, "10.0.0.5"}, cert.ValidPrincipals)
	caPub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(env.auth.HostCAKeys()[0]))
	require.NoError(t, err)
	require.Equal(t, caPub.Marshal(), cert.SignatureKey.Marshal())

	_, err = env.auth.GenerateHostCert(context.Background(), HostCertRequest{PublicKey: pub, UUID: "x", Role: "admin"})
	require.True(t, trace.IsBadParameter(err), "%v", err)
}

func TestCreateUser(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "bob", []byte("pw"), []string{"bob"}, nil, false)
	require.NoError(t, err)
	_, err = env.auth.CreateUser(ctx, "bob", []byte("pw2"), nil, nil, false)
	requireKind(t, err, trace.IsAlreadyExists, `user "bob" already exists`)
	_, err = env.auth.CreateUser(ctx, "carol", []byte("pw"), nil, []string{"nope"}, false)
	requireKind(t, err, trace.IsNotFound, `role "nope" does not exist`)
	_, err = env.auth.CreateUser(ctx, "../etc", []byte("pw"), nil, nil, false)
	require.True(t, trace.IsBadParameter(err), "%v", err)

	users, err := env.auth.ListUsers(ctx)
	require.NoError(t, err)
	require.Len(t, users, 1)
	require.Equal(t, []string{services.PresetAccessRole}, users[0].Roles)
	require.Empty(t, users[0].PasswordHash)

	require.NoError(t, env.auth.DeleteUser(ctx, "bob"))
	requireKind(t, env.auth.DeleteUser(ctx, "bob"), trace.IsNotFound, `user "bob" not found`)
}

func TestAuthenticateUser(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "dave", []byte("right-pw"), []string{"dave"}, nil, false)
	require.NoError(t, err)

	user, err := env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "dave", Password: "right-pw", RemoteAddr: "10.1.1.1:5555"})
	require.NoError(t, err)
	require.Equal(t, "dave", user.Name)
	require.Empty(t, user.PasswordHash)

	// Wrong password and unknown user are indistinguishable.
	_, errWrong := env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "dave", Password: "nope", RemoteAddr: "10.1.1.2:1"})
	_, errGhost := env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "ghost", Password: "nope", RemoteAddr: "10.1.1.3:1"})
	require.True(t, trace.IsAccessDenied(errWrong))
	require.True(t, trace.IsAccessDenied(errGhost))
	require.Equal(t, errWrong.Error(), errGhost.Error())
	require.Equal(t, "invalid credentials", errWrong.Error())
}

func TestTOTP(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	otpURL, err := env.auth.CreateUser(ctx, "frank", []byte("pw"), []string{"frank"}, nil, true)
	require.NoError(t, err)
	u, err := url.Parse(otpURL)
	require.NoError(t, err)
	require.Equal(t, "otpauth", u.Scheme)
	secret := u.Query().Get("secret")
	require.NotEmpty(t, secret)

	code, err := totp.GenerateCodeCustom(secret, env.clock.Now(), totpOpts)
	require.NoError(t, err)

	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "frank", Password: "pw"})
	requireKind(t, err, trace.IsAccessDenied, "invalid credentials")
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "frank", Password: "pw", OTP: "000000x"})
	requireKind(t, err, trace.IsAccessDenied, "invalid credentials")
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "frank", Password: "wrong", OTP: code})
	requireKind(t, err, trace.IsAccessDenied, "invalid credentials")
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "frank", Password: "pw", OTP: code})
	require.NoError(t, err)
	// The same code cannot be replayed.
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "frank", Password: "pw", OTP: code})
	requireKind(t, err, trace.IsAccessDenied, "invalid credentials")

	// Codes follow the server's clock: one from 5 minutes ago is stale.
	old, err := totp.GenerateCodeCustom(secret, env.clock.Now().Add(-5*time.Minute), totpOpts)
	require.NoError(t, err)
	env.clock.Advance(time.Minute)
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "frank", Password: "pw", OTP: old})
	requireKind(t, err, trace.IsAccessDenied, "invalid credentials")
	fresh, err := totp.GenerateCodeCustom(secret, env.clock.Now(), totpOpts)
	require.NoError(t, err)
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "frank", Password: "pw", OTP: fresh})
	require.NoError(t, err)
}

func TestAuthenticateSSHUser(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "gina", []byte("pw"), []string{"gina"}, nil, false)
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	resp, err := env.auth.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{
		AuthRequest: authapi.AuthRequest{User: "gina", Password: "pw"}, PublicKey: pub, TTL: time.Hour,
	})
	require.NoError(t, err)
	require.Equal(t, "gina", resp.Username)
	require.Equal(t, []string{"gina"}, parseSSHCert(t, resp.Cert).ValidPrincipals)
	require.Equal(t, []authapi.HostSigner{{ClusterName: testCluster, CheckingKeys: env.auth.HostCAKeys()}}, resp.HostSigners)

	_, err = env.auth.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{AuthRequest: authapi.AuthRequest{User: "gina", Password: "no"}, PublicKey: pub})
	requireKind(t, err, trace.IsAccessDenied, "invalid credentials")
}

func TestCAPin(t *testing.T) {
	env := newTestAuth(t)
	pin, err := CAPin(env.auth.TLSCACertPEM())
	require.NoError(t, err)
	require.Equal(t, env.auth.CAPin(), pin)
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, pin)
	require.NoError(t, checkCAPin(pin))
	require.Error(t, checkCAPin("sha1:abcd"))
	require.Error(t, checkCAPin("sha256:zz"))
	_, err = CAPin([]byte("not pem"))
	require.Error(t, err)
}

func TestNewServerConfig(t *testing.T) {
	_, err := NewServer(ServerConfig{ClusterName: "c"})
	require.True(t, trace.IsBadParameter(err))
	store := newTestStore(t, clockwork.NewFakeClock())
	_, err = NewServer(ServerConfig{Store: store, ClusterName: "bad/name"})
	require.True(t, trace.IsBadParameter(err))
}
