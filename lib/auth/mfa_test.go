package auth

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
	err = env.auth.checkSecondFactor(ctx, user, "123456")
	require.ErrorContains(t, err, "none usable is registered")

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
