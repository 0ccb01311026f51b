package services

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

func TestMFADevices(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewFakeClock())
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	key := MFADevice{ID: "d1", User: "alice", Kind: MFAKindWebAuthn, Name: "yubikey", Created: now,
		WebAuthn: &WebAuthnCredential{CredentialID: []byte{1}, PublicKey: []byte{2}, SignCount: 5}}
	require.NoError(t, s.CreateMFADevice(ctx, key))
	dup := key
	dup.ID = "d2"
	require.True(t, trace.IsAlreadyExists(s.CreateMFADevice(ctx, dup)), "a second device of the same name")
	otp := MFADevice{ID: "d3", User: "alice", Kind: MFAKindTOTP, Name: "phone", Created: now.Add(time.Second), TOTPSecret: "S"}
	require.NoError(t, s.CreateMFADevice(ctx, otp))
	// Another user's devices are not alice's ("alice2" shares the prefix).
	other := key
	other.User = "alice2"
	require.NoError(t, s.CreateMFADevice(ctx, other))

	got, err := s.GetMFADevices(ctx, "alice")
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "yubikey", got[0].Name)

	// Compare and swap: an update from a stale read is refused.
	after := got[0]
	after.WebAuthn = &WebAuthnCredential{CredentialID: []byte{1}, PublicKey: []byte{2}, SignCount: 6}
	require.NoError(t, s.UpdateMFADevice(ctx, got[0], after))
	stale := got[0]
	stale.WebAuthn = &WebAuthnCredential{CredentialID: []byte{1}, PublicKey: []byte{2}, SignCount: 7}
	require.True(t, trace.IsCompareFailed(s.UpdateMFADevice(ctx, got[0], stale)))

	require.NoError(t, s.DeleteMFADevices(ctx, "alice"))
	got, err = s.GetMFADevices(ctx, "alice")
	require.NoError(t, err)
	require.Empty(t, got)
	got, err = s.GetMFADevices(ctx, "alice2")
	require.NoError(t, err)
	require.Len(t, got, 1)

	bad := key
	bad.Name = "a\x01b"
	require.Error(t, s.CreateMFADevice(ctx, bad))
	bad = key
	bad.Kind = "sms"
	require.ErrorContains(t, s.CreateMFADevice(ctx, bad), `device kind "sms"`)
}

func TestAuthPreference(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewFakeClock())
	_, err := s.GetAuthPreference(ctx)
	require.True(t, trace.IsNotFound(err))

	kind, v, err := UnmarshalResource([]byte("kind: auth_preference\nspec:\n  second_factor: webauthn\n  webauthn:\n    rp_id: example.com\n    origins: [https://proxy.example.com:3080]\n  passwordless: true\n"), "ap.yaml")
	require.NoError(t, err)
	require.Equal(t, KindAuthPreference, kind)
	p := v.(*AuthPreference)
	require.NoError(t, s.SetAuthPreference(ctx, p))
	got, err := s.GetAuthPreference(ctx)
	require.NoError(t, err)
	require.Equal(t, SecondFactorWebAuthn, got.Spec.SecondFactor)
	require.True(t, got.Spec.Passwordless)
	require.True(t, got.AllowsWebAuthn())
	require.False(t, got.AllowsOTP())

	for _, tc := range []struct{ yaml, want string }{
		{"kind: auth_preference\nspec: {second_factor: sms}\n", `second_factor "sms"`},
		{"kind: auth_preference\nspec: {webauthn: {rp_id: 127.0.0.1}}\n", "is an IP address"},
		{"kind: auth_preference\nspec: {webauthn: {rp_id: example.com, origins: [https://evil.com]}}\n", "is not \"example.com\" or under it"},
		{"kind: auth_preference\nspec: {webauthn: {rp_id: example.com, origins: [example.com]}}\n", "is not an origin"},
		{"kind: auth_preference\nmetadata: {name: other}\n", "singleton"},
	} {
		_, _, err := UnmarshalResource([]byte(tc.yaml), "ap.yaml")
		require.ErrorContains(t, err, tc.want, tc.yaml)
	}
}
