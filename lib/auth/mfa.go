package auth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// Second factors. A user's factors are device records (services.MFADevice),
// several per user, of two kinds: TOTP (a code typed with the password)
// and WebAuthn (a passkey, a ceremony of its own: begin, then finish with
// the authenticator's signature). Each kind sits behind mfaVerifier; the
// policy of which kinds a login needs is mfaNeeds, a pure function of the
// cluster's auth_preference and the user's devices.
//
// Users enrolled before devices existed have their secret in the user
// record (services.User.TOTPSecret). It is read as one more TOTP device,
// legacyTOTPDeviceID, rather than migrated: `pctl users add --otp` keeps
// writing it, and nothing rewrites a user record behind an admin's back.

// legacyTOTPDeviceID names the TOTP secret kept in a user's record.
const legacyTOTPDeviceID = "otp"

// mfaVerifier is one kind of second factor.
type mfaVerifier interface {
	// Kind is services.MFAKindTOTP or services.MFAKindWebAuthn.
	Kind() string
	// Verify checks resp against user's devices of this kind and returns
	// the device that answered, its use recorded (last used, and what
	// makes a replay fail: the TOTP step, the WebAuthn sign count).
	Verify(ctx context.Context, user *services.User, devs []services.MFADevice, resp mfaResponse) (*services.MFADevice, error)
}

// mfaResponse is the answer to a challenge: a code, or a WebAuthn
// assertion checked against the challenge taken from the backend.
type mfaResponse struct {
	totpCode  string
	challenge *services.MFAChallenge
	assertion []byte
	// remoteAddr and method are for the audit of a refused passkey.
	remoteAddr, method string
}

// mfaNeed is what a login of one user needs besides the password.
type mfaNeed struct {
	// required: a login without a second factor is refused.
	required bool
	// totp and webauthn: the kinds that may satisfy it (the user has a
	// device of that kind and the cluster allows the kind).
	totp, webauthn bool
}

// mfaNeeds decides what a login needs. Without an auth_preference (or
// with second_factor off) a user's own factors are required, whichever
// they are; otherwise the preference says which kinds count and that
// one is always required.
func mfaNeeds(pref *services.AuthPreference, devs []services.MFADevice) mfaNeed {
	var hasTOTP, hasWebAuthn bool
	for _, d := range devs {
		switch d.Kind {
		case services.MFAKindTOTP:
			hasTOTP = true
		case services.MFAKindWebAuthn:
			hasWebAuthn = true
		}
	}
	if pref == nil || !pref.Required() {
		return mfaNeed{required: hasTOTP || hasWebAuthn, totp: hasTOTP, webauthn: hasWebAuthn}
	}
	return mfaNeed{required: true, totp: hasTOTP && pref.AllowsOTP(), webauthn: hasWebAuthn && pref.AllowsWebAuthn()}
}

// mfaDevices returns user's devices, the legacy TOTP secret included as a
// device, secrets included.
func (s *Server) mfaDevices(ctx context.Context, user *services.User) ([]services.MFADevice, error) {
	devs, err := s.store.GetMFADevices(ctx, user.Name)
	if err != nil && !trace.IsNotFound(err) {
		return nil, trace.Wrap(err)
	}
	if user.TOTPSecret != "" {
		legacy := services.MFADevice{
			ID: legacyTOTPDeviceID, User: user.Name, Kind: services.MFAKindTOTP, Name: "otp",
			Created: user.Created, TOTPSecret: user.TOTPSecret,
		}
		devs = append([]services.MFADevice{legacy}, devs...)
	}
	return devs, nil
}

// authPreference returns the cluster's auth_preference, nil when none is
// set.
func (s *Server) authPreference(ctx context.Context) (*services.AuthPreference, error) {
	pref, err := s.store.GetAuthPreference(ctx)
	if trace.IsNotFound(err) {
		return nil, nil
	}
	return pref, trace.Wrap(err)
}

// errPasskeyRequired refuses a password login (psh, or a web login
// without the passkey step) of a user whose only allowed factor is a
// passkey. It is said only after the password was proven, so it tells
// nothing to someone guessing.
func errPasskeyRequired() error {
	return trace.AccessDenied("this account signs in with a passkey: use the web login page")
}

// errNoFactorEnrolled refuses a login that needs a second factor the user
// does not have.
func errNoFactorEnrolled() error {
	return trace.AccessDenied("a second factor is required and none usable is registered for this account; ask an administrator")
}

// checkSecondFactor is the second half of a password login: the user's
// password was proven; code is the TOTP code given with it, if any.
func (s *Server) checkSecondFactor(ctx context.Context, user *services.User, code string) error {
	pref, err := s.authPreference(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return trace.Wrap(err)
	}
	need := mfaNeeds(pref, devs)
	switch {
	case !need.required:
		return nil
	case need.totp:
		_, err := totpVerifier{s}.Verify(ctx, user, devs, mfaResponse{totpCode: code})
		return trace.Wrap(err)
	case need.webauthn:
		return errPasskeyRequired()
	case canRegisterFirstFactor(pref, user):
		return errMustRegister()
	default:
		return errNoFactorEnrolled()
	}
}

// totpVerifier checks TOTP codes (RFC 6238) against every TOTP device of
// the user.
type totpVerifier struct{ s *Server }

var _ mfaVerifier = totpVerifier{}

// Kind is services.MFAKindTOTP.
func (totpVerifier) Kind() string { return services.MFAKindTOTP }

// Verify implements mfaVerifier. A code is spent for the user, whatever
// device produced it (spendOTP's rule: one acceptance per user and time
// step).
func (v totpVerifier) Verify(ctx context.Context, user *services.User, devs []services.MFADevice, resp mfaResponse) (*services.MFADevice, error) {
	if resp.totpCode == "" {
		return nil, errInvalidCredentials()
	}
	now := v.s.clock.Now()
	for i := range devs {
		d := devs[i]
		if d.Kind != services.MFAKindTOTP {
			continue
		}
		step, ok := matchTOTPStep(d.TOTPSecret, resp.totpCode, now)
		if !ok {
			continue
		}
		if err := v.s.spendOTP(ctx, user.Name, step); err != nil {
			return nil, trace.Wrap(err)
		}
		if d.ID != legacyTOTPDeviceID {
			after := d
			after.LastUsed = now
			if err := v.s.store.UpdateMFADevice(ctx, d, after); err != nil {
				// The code is spent and valid: a lost race on the
				// last-used time does not undo the login.
				v.s.log.WithError(err).WithField("user", user.Name).Debug("Could not record a TOTP device's last use.")
			}
		}
		return &d, nil
	}
	return nil, errInvalidCredentials()
}

// newMFAID is a fresh random id for a device or a challenge.
func newMFAID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+).
	return hex.EncodeToString(b[:])
}

// MFASummary is how `pctl users ls` shows a user's factors: "otp",
// "webauthn:2" (kind, and the count when above one).
func MFASummary(devs []services.MFADevice) []string {
	counts := map[string]int{}
	var order []string
	for _, d := range devs {
		if counts[d.Kind] == 0 {
			order = append(order, d.Kind)
		}
		counts[d.Kind]++
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		name := k
		if k == services.MFAKindTOTP {
			name = "otp"
		}
		if counts[k] > 1 {
			name = fmt.Sprintf("%s:%d", name, counts[k])
		}
		out = append(out, name)
	}
	return out
}

// publicDevice is what a device's owner sees of it.
func publicDevice(d services.MFADevice) authapi.MFADevice {
	return authapi.MFADevice{ID: d.ID, Kind: d.Kind, Name: d.Name, Created: d.Created, LastUsed: d.LastUsed}
}

// ListMFADevices lists the devices of a web session's user.
func (s *Server) ListMFADevices(ctx context.Context, ref authapi.WebSessionRequest) ([]authapi.MFADevice, error) {
	user, err := s.webSessionUser(ctx, ref)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := make([]authapi.MFADevice, 0, len(devs))
	for _, d := range devs {
		out = append(out, publicDevice(d))
	}
	return out, nil
}

// RenameMFADevice renames one of a web session's user's devices.
func (s *Server) RenameMFADevice(ctx context.Context, req authapi.MFADeviceRequest) error {
	user, err := s.webSessionUser(ctx, req.WebSessionRequest)
	if err != nil {
		return trace.Wrap(err)
	}
	if err := services.CheckMFADeviceName(req.NewName); err != nil {
		return trace.Wrap(err)
	}
	if req.ID == legacyTOTPDeviceID && user.TOTPSecret != "" {
		return trace.BadParameter("the OTP enrolled by an administrator cannot be renamed")
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return trace.Wrap(err)
	}
	var found *services.MFADevice
	for i := range devs {
		if devs[i].Name == req.NewName && devs[i].ID != req.ID {
			return trace.AlreadyExists("you already have a device named %q", req.NewName)
		}
		if devs[i].ID == req.ID {
			found = &devs[i]
		}
	}
	if found == nil {
		return trace.NotFound("device %q not found", req.ID)
	}
	after := *found
	after.Name = req.NewName
	return trace.Wrap(s.store.UpdateMFADevice(ctx, *found, after))
}

// DeleteMFADevice removes one of a web session's user's devices, unless
// it is the last factor the cluster's auth_preference accepts while it
// requires one: a user cannot lock themselves out.
func (s *Server) DeleteMFADevice(ctx context.Context, req authapi.MFADeviceRequest) error {
	user, err := s.webSessionUser(ctx, req.WebSessionRequest)
	if err != nil {
		return trace.Wrap(err)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return trace.Wrap(err)
	}
	var found *services.MFADevice
	rest := make([]services.MFADevice, 0, len(devs))
	for i := range devs {
		if devs[i].ID == req.ID {
			found = &devs[i]
			continue
		}
		rest = append(rest, devs[i])
	}
	if found == nil {
		return trace.NotFound("device %q not found", req.ID)
	}
	pref, err := s.authPreference(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	if pref != nil && pref.Required() {
		if need := mfaNeeds(pref, rest); !need.totp && !need.webauthn {
			return trace.BadParameter("%q is your last second factor and second_factor is %q: register another one first", found.Name, pref.Spec.SecondFactor)
		}
	}
	if found.ID == legacyTOTPDeviceID {
		err = s.clearLegacyTOTP(ctx, user.Name)
	} else {
		err = s.store.DeleteMFADevice(ctx, user.Name, found.ID)
	}
	if err != nil {
		return trace.Wrap(err)
	}
	s.cfg.Audit.Emit(ctx, events.Event{Type: events.MFADelete, User: user.Name, Fields: events.Fields{"device": found.Name, "kind": found.Kind}})
	return nil
}

// clearLegacyTOTP removes the TOTP secret kept in a user's record.
func (s *Server) clearLegacyTOTP(ctx context.Context, name string) error {
	u, err := s.store.GetUser(ctx, name)
	if err != nil {
		return trace.Wrap(err)
	}
	if u.TOTPSecret == "" {
		return nil
	}
	u.TOTPSecret = ""
	return trace.Wrap(s.store.UpsertUser(ctx, *u))
}

// ResetMFA removes every second factor of a user (`pctl users reset-mfa`,
// for a lost device) and audits it. The user then logs in as one without
// factors: with a second_factor required, they cannot until they are
// given one (a TOTP by `pctl users add --otp` after removal, say).
func (s *Server) ResetMFA(ctx context.Context, name, by string) (int, error) {
	user, err := s.getUser(ctx, name)
	if err != nil {
		return 0, trace.Wrap(err)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return 0, trace.Wrap(err)
	}
	if err := s.store.DeleteMFADevices(ctx, name); err != nil {
		return 0, trace.Wrap(err)
	}
	if err := s.clearLegacyTOTP(ctx, name); err != nil {
		return 0, trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"user": name, "removed": len(devs), "by": by}).Info("Reset a user's second factors.")
	s.cfg.Audit.Emit(ctx, events.Event{Type: events.MFAReset, User: by, Fields: events.Fields{"target_user": name, "removed": len(devs)}})
	return len(devs), nil
}

// webSessionUser is the user record of a web session named by its two
// secrets.
func (s *Server) webSessionUser(ctx context.Context, ref authapi.WebSessionRequest) (*services.User, error) {
	_, ws, err := s.webSessionBySecret(ctx, ref.SessionID, ref.Token)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	user, err := s.store.GetUser(ctx, ws.User)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return user, nil
}
