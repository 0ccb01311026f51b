package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// WebAuthn ceremonies (W3C WebAuthn Level 2), with go-webauthn doing the
// cryptography and the checks of each step. What is ours:
//
//   - The relying party comes from auth_preference (webauthn.rp_id and
//     origins), else from the first proxy's public web address.
//   - A challenge is a backend item (services.MFAChallenge) that lives
//     MFAChallengeTTL and is taken (read and deleted) by the one finish
//     that uses it: any proxy may finish a ceremony another began, and no
//     answer is checked twice, whether it verifies or not.
//   - A challenge names the user it was issued to; a finish for another
//     user (or with a credential of another user) is refused.
//   - The signature counter must go up (section 6.1.1, step 21 of 7.2): a
//     counter at or below the stored one is a cloned authenticator or a
//     replayed assertion; the login is refused and audited
//     (mfa.clone_warning). The new counter is written by compare and swap,
//     so two logins racing with one assertion cannot both pass.
//   - Attestation is "none": Postern trusts a passkey because its owner
//     registered it inside a logged-in session, not because of its make.

// MFAChallengeTTL bounds a ceremony: enough for a person to find and touch
// a security key (browsers time out at about this too), short enough that
// a leaked challenge is soon worthless.
const MFAChallengeTTL = 5 * time.Minute

// webAuthnUser is a user as go-webauthn sees them.
type webAuthnUser struct {
	name  string
	id    []byte
	creds []webauthn.Credential
	devs  []services.MFADevice
}

var _ webauthn.User = (*webAuthnUser)(nil)

func (u *webAuthnUser) WebAuthnID() []byte                         { return u.id }
func (u *webAuthnUser) WebAuthnName() string                       { return u.name }
func (u *webAuthnUser) WebAuthnDisplayName() string                { return u.name }
func (u *webAuthnUser) WebAuthnCredentials() []webauthn.Credential { return u.creds }

// device is the record of the credential with id.
func (u *webAuthnUser) device(id []byte) *services.MFADevice {
	for i := range u.devs {
		if w := u.devs[i].WebAuthn; w != nil && bytes.Equal(w.CredentialID, id) {
			return &u.devs[i]
		}
	}
	return nil
}

// webAuthnUserHandle is the user handle of name's credentials: derived
// from the cluster and the name, so it needs no stored state, and opaque
// (a hash), as section 14.6.1 asks: it carries no name an authenticator
// could show to someone else. A user deleted and created again gets the
// same handle, but their devices were deleted with them, so an old
// passkey finds no credential record.
func (s *Server) webAuthnUserHandle(name string) []byte {
	h := sha256.Sum256([]byte("postern webauthn user\x00" + s.cfg.ClusterName + "\x00" + name))
	return h[:]
}

// newWebAuthnUser loads a user's passkeys.
func (s *Server) newWebAuthnUser(name string, devs []services.MFADevice) *webAuthnUser {
	u := &webAuthnUser{name: name, id: s.webAuthnUserHandle(name)}
	for _, d := range devs {
		if d.Kind != services.MFAKindWebAuthn || d.WebAuthn == nil {
			continue
		}
		w := d.WebAuthn
		transports := make([]protocol.AuthenticatorTransport, 0, len(w.Transports))
		for _, t := range w.Transports {
			transports = append(transports, protocol.AuthenticatorTransport(t))
		}
		u.creds = append(u.creds, webauthn.Credential{
			ID: w.CredentialID, PublicKey: w.PublicKey, AttestationType: w.AttestationType, Transport: transports,
			Flags:         webauthn.CredentialFlags{BackupEligible: w.BackupEligible, BackupState: w.BackupState},
			Authenticator: webauthn.Authenticator{AAGUID: w.AAGUID, SignCount: w.SignCount},
		})
		u.devs = append(u.devs, d)
	}
	return u
}

// relyingParty builds the WebAuthn relying party of this moment's
// auth_preference.
func (s *Server) relyingParty(ctx context.Context, pref *services.AuthPreference) (*webauthn.WebAuthn, error) {
	var rp services.WebAuthnPreference
	if pref != nil && pref.Spec.WebAuthn != nil {
		rp = *pref.Spec.WebAuthn
	} else {
		def, err := s.defaultRelyingParty(ctx)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		rp = def
	}
	if len(rp.Origins) == 0 {
		rp.Origins = []string{"https://" + rp.RPID}
	}
	w, err := webauthn.New(&webauthn.Config{
		RPID:          rp.RPID,
		RPDisplayName: "Postern " + s.cfg.ClusterName,
		RPOrigins:     rp.Origins,
		// Timeouts are enforced here, by the challenge's expiry on the
		// auth server's clock: the library's would read the wall clock.
		AttestationPreference: protocol.PreferNoAttestation,
	})
	if err != nil {
		return nil, trace.BadParameter("webauthn relying party %q: %v", rp.RPID, err)
	}
	return w, nil
}

// defaultRelyingParty is the first proxy's public web address, as host
// name (the RP id) and origin.
func (s *Server) defaultRelyingParty(ctx context.Context) (services.WebAuthnPreference, error) {
	proxies, err := s.store.GetProxies(ctx, s.cfg.ClusterName)
	if err != nil {
		return services.WebAuthnPreference{}, trace.Wrap(err)
	}
	for _, p := range proxies {
		if p.WebAddr == "" {
			continue
		}
		host, port, err := net.SplitHostPort(p.WebAddr)
		if err != nil || host == "" {
			continue
		}
		if net.ParseIP(host) != nil {
			return services.WebAuthnPreference{}, trace.BadParameter(
				"passkeys need a host name: the proxy's web address %q is an IP address, which cannot be a WebAuthn RP id; set webauthn.rp_id and origins in auth_preference", p.WebAddr)
		}
		origin := (&url.URL{Scheme: "https", Host: net.JoinHostPort(host, port)}).String()
		return services.WebAuthnPreference{RPID: host, Origins: []string{origin}}, nil
	}
	return services.WebAuthnPreference{}, trace.BadParameter("passkeys need a relying party: no proxy has announced its web address; set webauthn.rp_id and origins in auth_preference")
}

// storeChallenge keeps a ceremony's session data until it is finished.
func (s *Server) storeChallenge(ctx context.Context, user, purpose, deviceName string, session *webauthn.SessionData, options any) (*authapi.MFAChallenge, error) {
	session.Expires = time.Time{}
	sessJSON, err := json.Marshal(session)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	optJSON, err := json.Marshal(options)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	c := services.MFAChallenge{
		ID: newMFAID(), User: user, Purpose: purpose, Session: sessJSON, DeviceName: deviceName,
		Expires: s.clock.Now().Add(MFAChallengeTTL),
	}
	if err := s.store.CreateMFAChallenge(ctx, c); err != nil {
		return nil, trace.Wrap(err)
	}
	return &authapi.MFAChallenge{ChallengeID: c.ID, WebAuthn: optJSON}, nil
}

// takeChallenge takes a ceremony for one of purposes out of the backend
// (once).
func (s *Server) takeChallenge(ctx context.Context, id string, purposes ...string) (*services.MFAChallenge, *webauthn.SessionData, error) {
	c, err := s.store.TakeMFAChallenge(ctx, id)
	if err != nil {
		if trace.IsNotFound(err) {
			return nil, nil, trace.AccessDenied("the passkey challenge is unknown, already used or expired: start again")
		}
		return nil, nil, trace.Wrap(err)
	}
	if !s.clock.Now().Before(c.Expires) {
		return nil, nil, trace.AccessDenied("the passkey challenge is unknown, already used or expired: start again")
	}
	if !slices.Contains(purposes, c.Purpose) {
		return nil, nil, trace.AccessDenied("the passkey challenge was issued for a %s, not a %s", c.Purpose, strings.Join(purposes, " or "))
	}
	var session webauthn.SessionData
	if err := json.Unmarshal(c.Session, &session); err != nil {
		return nil, nil, trace.BadParameter("corrupt passkey challenge %q: %v", c.ID, err)
	}
	return c, &session, nil
}

// BeginWebAuthnRegistration starts adding a passkey named req.DeviceName
// to the user of a web session.
func (s *Server) BeginWebAuthnRegistration(ctx context.Context, req authapi.MFARegisterBeginRequest) (*authapi.MFAChallenge, error) {
	user, err := s.webSessionUser(ctx, req.WebSessionRequest)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if user.Connector != "" {
		// A passkey would let a single sign-on user in without the
		// identity provider, with the roles of their last login.
		return nil, trace.BadParameter("passkeys are for local users: %q signs in through its identity provider", user.Name)
	}
	if err := services.CheckMFADeviceName(req.DeviceName); err != nil {
		return nil, trace.Wrap(err)
	}
	pref, err := s.authPreference(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if pref != nil && pref.Spec.SecondFactor == services.SecondFactorOTP {
		return nil, trace.AccessDenied("passkeys are not allowed: auth_preference second_factor is %q", pref.Spec.SecondFactor)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for _, d := range devs {
		if d.Name == req.DeviceName {
			return nil, trace.AlreadyExists("you already have a device named %q", req.DeviceName)
		}
	}
	rp, err := s.relyingParty(ctx, pref)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	wu := s.newWebAuthnUser(user.Name, devs)
	exclude := make([]protocol.CredentialDescriptor, 0, len(wu.creds))
	for _, c := range wu.creds {
		exclude = append(exclude, c.Descriptor())
	}
	creation, session, err := rp.BeginRegistration(wu,
		webauthn.WithExclusions(exclude),
		webauthn.WithConveyancePreference(protocol.PreferNoAttestation),
		// A discoverable credential (resident key) is what passwordless
		// needs; preferred, so a key without room for one still works as
		// a second factor.
		webauthn.WithResidentKeyRequirement(protocol.ResidentKeyRequirementPreferred),
	)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.storeChallenge(ctx, user.Name, services.MFAPurposeRegister, req.DeviceName, session, creation)
}

// FinishWebAuthnRegistration checks the authenticator's answer and stores
// the new passkey.
func (s *Server) FinishWebAuthnRegistration(ctx context.Context, req authapi.MFAFinishRequest) (*authapi.MFADevice, error) {
	user, err := s.webSessionUser(ctx, req.WebSessionRequest)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	c, session, err := s.takeChallenge(ctx, req.ChallengeID, services.MFAPurposeRegister)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if c.User != user.Name {
		s.log.WithFields(map[string]any{"user": user.Name, "challenge_user": c.User}).Warn("Refused a passkey registration finished by another user.")
		return nil, trace.AccessDenied("the passkey challenge was issued to another user")
	}
	parsed, err := protocol.ParseCredentialCreationResponseBytes(req.WebAuthn)
	if err != nil {
		return nil, trace.BadParameter("invalid passkey registration: %v", protocolDetail(err))
	}
	pref, err := s.authPreference(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	rp, err := s.relyingParty(ctx, pref)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cred, err := rp.CreateCredential(s.newWebAuthnUser(user.Name, devs), *session, parsed)
	if err != nil {
		s.log.WithField("user", user.Name).WithError(err).Info("Refused a passkey registration.")
		return nil, trace.AccessDenied("passkey registration failed: %v", protocolDetail(err))
	}
	transports := make([]string, 0, len(cred.Transport))
	for _, t := range cred.Transport {
		transports = append(transports, string(t))
	}
	dev := services.MFADevice{
		ID: newMFAID(), User: user.Name, Kind: services.MFAKindWebAuthn, Name: c.DeviceName, Created: s.clock.Now(),
		WebAuthn: &services.WebAuthnCredential{
			CredentialID: cred.ID, PublicKey: cred.PublicKey, AttestationType: cred.AttestationType,
			AAGUID: cred.Authenticator.AAGUID, SignCount: cred.Authenticator.SignCount, Transports: transports,
			UserHandle: s.webAuthnUserHandle(user.Name), BackupEligible: cred.Flags.BackupEligible, BackupState: cred.Flags.BackupState,
		},
	}
	if owner, _, err := s.findCredential(ctx, cred.ID); err == nil {
		return nil, trace.AlreadyExists("this passkey is already registered (to %s)", ownerWord(owner, user.Name))
	} else if !trace.IsNotFound(err) {
		return nil, trace.Wrap(err)
	}
	if err := s.store.CreateMFADevice(ctx, dev); err != nil {
		return nil, trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"user": user.Name, "device": dev.Name}).Info("Registered a passkey.")
	s.cfg.Audit.Emit(ctx, events.Event{Type: events.MFAAdd, User: user.Name, Fields: events.Fields{"device": dev.Name, "kind": dev.Kind}})
	s.endRegisterOnly(ctx, req.WebSessionRequest)
	out := publicDevice(dev)
	return &out, nil
}

// ownerWord says whose a credential is without naming another user.
func ownerWord(owner, self string) string {
	if owner == self {
		return "you"
	}
	return "another user"
}

// findCredential finds the device of a credential id among every user's:
// a passwordless login learns the user from the credential. Device
// records are few (a handful per user), so this is a scan.
func (s *Server) findCredential(ctx context.Context, credID []byte) (string, *services.MFADevice, error) {
	devs, err := s.store.GetAllMFADevices(ctx)
	if err != nil {
		return "", nil, trace.Wrap(err)
	}
	for i := range devs {
		if w := devs[i].WebAuthn; w != nil && bytes.Equal(w.CredentialID, credID) {
			return devs[i].User, &devs[i], nil
		}
	}
	return "", nil, trace.NotFound("unknown passkey")
}

// protocolDetail is the most useful text of a go-webauthn error: its
// details ("Error validating origin"), not its generic type.
func protocolDetail(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Details != "" {
		if pe.DevInfo != "" {
			return pe.Details + " (" + pe.DevInfo + ")"
		}
		return pe.Details
	}
	return err.Error()
}
