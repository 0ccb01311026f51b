package services

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// A user's second factors are records of their own, several per user, kept
// beside the user record rather than inside it: a passkey's sign count
// changes at every login, and rewriting the whole user (password hash,
// roles) for that would race with an admin editing the user. One key per
// device: /mfa_devices/USER/ID.
const mfaDevicesPrefix = "mfa_devices"

// Kinds of MFADevice.
const (
	MFAKindTOTP     = "totp"
	MFAKindWebAuthn = "webauthn"
)

// maxMFADeviceName bounds a device's name: a label a person types ("work
// laptop", "yubikey 5c"), shown in lists.
const maxMFADeviceName = 64

// MFADevice is one second factor of a user.
type MFADevice struct {
	// ID is random and stable; the key component and what the web API
	// names a device by (names may change).
	ID string `json:"id"`
	// User owns the device.
	User string `json:"user"`
	// Kind is MFAKindTOTP or MFAKindWebAuthn.
	Kind string `json:"kind"`
	// Name is the owner's label, unique per user.
	Name string `json:"name"`
	// Created is when the device was registered.
	Created time.Time `json:"created"`
	// LastUsed is the last successful use; zero: never used.
	LastUsed time.Time `json:"last_used,omitzero"`
	// TOTPSecret is the base32 secret of a totp device; never sent to
	// clients.
	TOTPSecret string `json:"totp_secret,omitempty"`
	// WebAuthn is set for a webauthn device.
	WebAuthn *WebAuthnCredential `json:"webauthn,omitempty"`
}

// WebAuthnCredential is what a relying party keeps of a registered
// credential (WebAuthn Level 2, section 6.1 "credential record").
type WebAuthnCredential struct {
	// CredentialID is the authenticator's id of the credential.
	CredentialID []byte `json:"credential_id"`
	// PublicKey is the COSE-encoded public key.
	PublicKey []byte `json:"public_key"`
	// AttestationType is what the registration was attested with
	// ("none" by default).
	AttestationType string `json:"attestation_type,omitempty"`
	// AAGUID names the authenticator model (all zero under attestation
	// none for most authenticators).
	AAGUID []byte `json:"aaguid,omitempty"`
	// SignCount is the last signature counter seen: a later assertion
	// with a counter not above it (when either is non-zero) means a
	// cloned authenticator and is refused (section 6.1.1).
	SignCount uint32 `json:"sign_count"`
	// Transports are the authenticator's transports (usb, nfc,
	// internal...), a hint for the browser.
	Transports []string `json:"transports,omitempty"`
	// UserHandle is the user handle the credential was created with: a
	// discoverable credential returns it at a passwordless login.
	UserHandle []byte `json:"user_handle,omitempty"`
	// BackupEligible and BackupState are the BE and BS flags (synced
	// passkeys): the library refuses an assertion whose BE flag changed.
	BackupEligible bool `json:"backup_eligible,omitempty"`
	BackupState    bool `json:"backup_state,omitempty"`
}

// CheckAndSetDefaults validates a device record.
func (d *MFADevice) CheckAndSetDefaults() error {
	if err := CheckUserName(d.User); err != nil {
		return trace.Wrap(err)
	}
	if err := checkKeyComponent("device id", d.ID); err != nil {
		return trace.Wrap(err)
	}
	if err := CheckMFADeviceName(d.Name); err != nil {
		return trace.Wrap(err)
	}
	switch d.Kind {
	case MFAKindTOTP:
		if d.TOTPSecret == "" {
			return trace.BadParameter("totp device %q has no secret", d.Name)
		}
	case MFAKindWebAuthn:
		if d.WebAuthn == nil || len(d.WebAuthn.CredentialID) == 0 || len(d.WebAuthn.PublicKey) == 0 {
			return trace.BadParameter("webauthn device %q has no credential", d.Name)
		}
	default:
		return trace.BadParameter("device kind %q: want %q or %q", d.Kind, MFAKindTOTP, MFAKindWebAuthn)
	}
	return nil
}

// CheckMFADeviceName validates a device name a user typed.
func CheckMFADeviceName(name string) error {
	if strings.TrimSpace(name) == "" {
		return trace.BadParameter("device name is empty")
	}
	if len(name) > maxMFADeviceName {
		return trace.BadParameter("device name is longer than %d characters", maxMFADeviceName)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return trace.BadParameter("device name %q contains a control character", name)
		}
	}
	return nil
}

// StripSecrets returns the device without its TOTP secret: what clients see.
func (d MFADevice) StripSecrets() MFADevice {
	d.TOTPSecret = ""
	return d
}

func mfaDeviceKey(user, id string) string { return backend.Key(mfaDevicesPrefix, user, id) }

// CreateMFADevice adds a device; AlreadyExists when the user has a device
// of that name or that id.
func (s *Store) CreateMFADevice(ctx context.Context, d MFADevice) error {
	if err := d.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	existing, err := s.GetMFADevices(ctx, d.User)
	if err != nil {
		return trace.Wrap(err)
	}
	for _, e := range existing {
		if e.Name == d.Name {
			return trace.AlreadyExists("user %q already has a device named %q", d.User, d.Name)
		}
	}
	err = s.create(ctx, mfaDeviceKey(d.User, d.ID), d, time.Time{})
	if trace.IsAlreadyExists(err) {
		return trace.AlreadyExists("device %q of user %q already exists", d.ID, d.User)
	}
	return trace.Wrap(err)
}

// GetMFADevices returns a user's devices, secrets included, oldest first.
func (s *Store) GetMFADevices(ctx context.Context, user string) ([]MFADevice, error) {
	if CheckUserName(user) != nil {
		return nil, trace.NotFound("user %q not found", user)
	}
	out, err := getAll[MFADevice](ctx, s, backend.Prefix(mfaDevicesPrefix, user))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// GetMFADevice returns one device of a user.
func (s *Store) GetMFADevice(ctx context.Context, user, id string) (*MFADevice, error) {
	if CheckUserName(user) != nil || checkKeyComponent("device id", id) != nil {
		return nil, trace.NotFound("device %q not found", id)
	}
	var d MFADevice
	if err := s.get(ctx, mfaDeviceKey(user, id), &d, "device "+quote(id)+" not found"); err != nil {
		return nil, err
	}
	return &d, nil
}

// UpdateMFADevice rewrites a device if it has not changed since before
// was read (compare and swap): two logins racing with one passkey cannot
// both move its sign count forward from the same value.
func (s *Store) UpdateMFADevice(ctx context.Context, before, after MFADevice) error {
	if before.User != after.User || before.ID != after.ID {
		return trace.BadParameter("a device update cannot change its user or id")
	}
	if err := after.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	oldData, err := json.Marshal(before)
	if err != nil {
		return trace.Wrap(err)
	}
	newData, err := json.Marshal(after)
	if err != nil {
		return trace.Wrap(err)
	}
	key := mfaDeviceKey(after.User, after.ID)
	_, err = s.b.CompareAndSwap(ctx, backend.Item{Key: key, Value: oldData}, backend.Item{Key: key, Value: newData})
	if trace.IsCompareFailed(err) {
		return trace.CompareFailed("device %q of user %q changed meanwhile", after.ID, after.User)
	}
	if trace.IsNotFound(err) {
		return trace.NotFound("device %q not found", after.ID)
	}
	return trace.Wrap(err)
}

// DeleteMFADevice removes one device.
func (s *Store) DeleteMFADevice(ctx context.Context, user, id string) error {
	if CheckUserName(user) != nil || checkKeyComponent("device id", id) != nil {
		return trace.NotFound("device %q not found", id)
	}
	return s.delete(ctx, mfaDeviceKey(user, id), "device "+quote(id)+" not found")
}

// DeleteMFADevices removes every device of a user (a reset, or the user's
// deletion).
func (s *Store) DeleteMFADevices(ctx context.Context, user string) error {
	if err := CheckUserName(user); err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(s.b.DeleteRange(ctx, backend.Prefix(mfaDevicesPrefix, user)))
}

// HasMFADevice says whether any user has a device of kind (a scan of
// every device: the devices are few, and only /webapi/ping's hint asks,
// when no auth_preference says).
func (s *Store) HasMFADevice(ctx context.Context, kind string) (bool, error) {
	devs, err := s.GetAllMFADevices(ctx)
	if err != nil {
		return false, trace.Wrap(err)
	}
	for _, d := range devs {
		if d.Kind == kind {
			return true, nil
		}
	}
	return false, nil
}

// GetAllMFADevices returns every user's devices, secrets included.
func (s *Store) GetAllMFADevices(ctx context.Context) ([]MFADevice, error) {
	return getAll[MFADevice](ctx, s, backend.Prefix(mfaDevicesPrefix))
}
