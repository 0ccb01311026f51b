package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/services"
)

func TestMFANeeds(t *testing.T) {
	totp := services.MFADevice{Kind: services.MFAKindTOTP}
	key := services.MFADevice{Kind: services.MFAKindWebAuthn}
	pref := func(sf string) *services.AuthPreference {
		p := &services.AuthPreference{Spec: services.AuthPreferenceSpec{SecondFactor: sf}}
		require.NoError(t, p.CheckAndSetDefaults())
		return p
	}
	for _, tc := range []struct {
		name string
		pref *services.AuthPreference
		devs []services.MFADevice
		want mfaNeed
	}{
		{"no preference, no factor", nil, nil, mfaNeed{}},
		{"no preference, own otp", nil, []services.MFADevice{totp}, mfaNeed{required: true, totp: true}},
		{"no preference, own passkey", nil, []services.MFADevice{key}, mfaNeed{required: true, webauthn: true}},
		{"off still checks own factors", pref("off"), []services.MFADevice{totp, key}, mfaNeed{required: true, totp: true, webauthn: true}},
		{"otp required, none enrolled", pref("otp"), nil, mfaNeed{required: true}},
		{"otp required, only a passkey", pref("otp"), []services.MFADevice{key}, mfaNeed{required: true}},
		{"webauthn required, otp only", pref("webauthn"), []services.MFADevice{totp}, mfaNeed{required: true}},
		{"webauthn required", pref("webauthn"), []services.MFADevice{totp, key}, mfaNeed{required: true, webauthn: true}},
		{"on takes either", pref("on"), []services.MFADevice{totp, key}, mfaNeed{required: true, totp: true, webauthn: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, mfaNeeds(tc.pref, tc.devs))
		})
	}
}

func TestMFASummary(t *testing.T) {
	devs := []services.MFADevice{{Kind: services.MFAKindTOTP}, {Kind: services.MFAKindWebAuthn}, {Kind: services.MFAKindWebAuthn}}
	require.Equal(t, []string{"otp", "webauthn:2"}, MFASummary(devs))
	require.Empty(t, MFASummary(nil))
}

// TestSecondFactorFromPreference: the hint every proxy's /webapi/ping
// gives follows auth_preference when one is set, and the enrolments
// otherwise; a passkey-only user cannot log in with the password alone.
func TestSecondFactorFromPreference(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	sf, err := env.auth.ClusterSecondFactor(ctx)
	require.NoError(t, err)
	require.Equal(t, webapi.SecondFactorOff, sf)
	_, err = env.auth.CreateUser(ctx, "alice", []byte("alice password"), []string{"alice"}, nil, true)
	require.NoError(t, err)
	sf, err = env.auth.ClusterSecondFactor(ctx)
	require.NoError(t, err)
	require.Equal(t, webapi.SecondFactorOTP, sf)

	require.NoError(t, env.store.SetAuthPreference(ctx, &services.AuthPreference{Spec: services.AuthPreferenceSpec{SecondFactor: services.SecondFactorWebAuthn}}))
	sf, err = env.auth.ClusterSecondFactor(ctx)
	require.NoError(t, err)
	require.Equal(t, webapi.SecondFactorWebAuthn, sf)

	// alice's OTP does not count under "webauthn", and she has no passkey.
	user, err := env.store.GetUser(ctx, "alice")
	require.NoError(t, err)
	// Passkeys are allowed: she may register one in a register-only web
	// session; under "otp" there is nothing she could register herself.
	err = env.auth.checkSecondFactor(ctx, user, "123456")
	require.ErrorContains(t, err, "log in on the web page once to register a passkey")
	require.True(t, isMustRegister(err))
	require.NoError(t, env.store.SetAuthPreference(ctx, &services.AuthPreference{Spec: services.AuthPreferenceSpec{SecondFactor: services.SecondFactorOTP}}))
	err = env.auth.checkSecondFactor(ctx, user, "12345")
	require.ErrorContains(t, err, "invalid credentials")
	require.NoError(t, env.store.SetAuthPreference(ctx, &services.AuthPreference{Spec: services.AuthPreferenceSpec{SecondFactor: services.SecondFactorWebAuthn}}))

	// A passkey-only user is told to use the web login after a right password.
	require.NoError(t, env.store.CreateMFADevice(ctx, services.MFADevice{
		ID: "k1", User: "alice", Kind: services.MFAKindWebAuthn, Name: "key", Created: env.clock.Now(),
		WebAuthn: &services.WebAuthnCredential{CredentialID: []byte{1}, PublicKey: []byte{2}},
	}))
	err = env.auth.checkSecondFactor(ctx, user, "")
	require.ErrorContains(t, err, "use the web login page")

	// The admin's reset removes the legacy OTP and the passkey.
	n, err := env.auth.ResetMFA(ctx, "alice", "admin")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	users, err := env.auth.ListUsers(ctx)
	require.NoError(t, err)
	require.Empty(t, users[0].MFA)
	require.False(t, users[0].OTPEnabled)
}

// TestPasskeysAreForLocalUsers: a single sign-on user's passkey would let
// them in without their identity provider.
func TestPasskeysAreForLocalUsers(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	traits := map[string][]string{services.TraitLogins: {"alice"}}
	require.NoError(t, env.store.UpsertUser(ctx, services.User{Name: "sso-alice", Roles: []string{"access"}, Traits: traits, Connector: "sso:corp", Created: env.clock.Now()}))
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sshPub, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	sid, token := "session-id-of-sso-alice", "token-of-sso-alice"
	tokenHash := sha256.Sum256([]byte(token))
	_, err = env.auth.completeLogin(ctx, &LoginResult{User: "sso-alice", Connector: "oidc:corp", Roles: []string{"access"}, Traits: traits},
		LoginOutput{PublicKey: ssh.MarshalAuthorizedKey(sshPub), WebSession: &authapi.WebSessionInit{Key: webSessionKeyOf(sid), TokenHash: tokenHash[:]}})
	require.NoError(t, err)
	_, err = env.auth.BeginWebAuthnRegistration(ctx, authapi.MFARegisterBeginRequest{
		WebSessionRequest: authapi.WebSessionRequest{SessionID: sid, Token: token}, DeviceName: "key",
	})
	require.ErrorContains(t, err, "passkeys are for local users")
}
