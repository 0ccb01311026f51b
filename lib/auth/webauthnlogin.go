package auth

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// Passkey logins: after the password (the passkey is the second factor),
// or passwordless (a discoverable passkey that verified its user, when
// auth_preference allows it). Both end in completeLogin, like every
// other way in.

// Audited login methods (events.FieldMethod).
const (
	methodWebAuthn     = "webauthn"
	methodPasswordless = "passwordless"
)

// BeginWebAuthnLogin starts a passkey login. With a user and password,
// the password is checked first (behind the login limiter, audited when
// wrong), so a challenge, which names the user's credentials, is given
// only to someone who knows the password.
func (s *Server) BeginWebAuthnLogin(ctx context.Context, req authapi.MFALoginBeginRequest) (*authapi.MFAChallenge, error) {
	pref, err := s.authPreference(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if req.Passwordless {
		if req.User != "" || req.Password != "" {
			return nil, trace.BadParameter("a passwordless login names no user and no password")
		}
		if pref == nil || !pref.Spec.Passwordless || pref.Spec.SecondFactor == services.SecondFactorOTP {
			return nil, trace.AccessDenied("passwordless login is not enabled (auth_preference passwordless)")
		}
		rp, err := s.relyingParty(ctx, pref)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		assertion, session, err := rp.BeginDiscoverableLogin(webauthn.WithUserVerification(protocol.VerificationRequired))
		if err != nil {
			return nil, trace.Wrap(err)
		}
		return s.storeChallenge(ctx, "", services.MFAPurposePasswordless, "", session, assertion)
	}
	areq := authapi.AuthRequest{User: req.User, Password: req.Password, RemoteAddr: req.RemoteAddr}
	if err := s.limiter.check(req.User, req.RemoteAddr); err != nil {
		s.emitLoginMethod(ctx, events.AuthFailed, req.User, req.RemoteAddr, methodWebAuthn, trace.UserMessage(err))
		return nil, trace.Wrap(err)
	}
	user, err := s.checkPassword(ctx, areq)
	if err != nil {
		if trace.IsAccessDenied(err) {
			s.limiter.failure(req.User, req.RemoteAddr)
			s.emitLoginMethod(ctx, events.AuthFailed, req.User, req.RemoteAddr, methodWebAuthn, auditReason(err))
		}
		return nil, trace.Wrap(err)
	}
	devs, err := s.mfaDevices(ctx, user)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	need := mfaNeeds(pref, devs)
	if !need.webauthn {
		if need.totp {
			return nil, trace.BadParameter("this account's second factor is an OTP code, not a passkey")
		}
		if need.required {
			return nil, errNoFactorEnrolled()
		}
		return nil, trace.BadParameter("no passkey is registered for this account: sign in with the password alone")
	}
	rp, err := s.relyingParty(ctx, pref)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	assertion, session, err := rp.BeginLogin(s.newWebAuthnUser(user.Name, devs), webauthn.WithUserVerification(protocol.VerificationPreferred))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.storeChallenge(ctx, user.Name, services.MFAPurposeLogin, "", session, assertion)
}

// FinishWebAuthnLogin checks a passkey's assertion against the challenge
// and issues what a password login issues.
func (s *Server) FinishWebAuthnLogin(ctx context.Context, req authapi.MFALoginFinishRequest) (*authapi.SSHLoginResponse, error) {
	user, method, err := s.verifyWebAuthnLogin(ctx, req)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	s.limiter.success(user.Name, req.RemoteAddr)
	s.emitLoginMethod(ctx, events.AuthLogin, user.Name, req.RemoteAddr, method, "")
	res := &LoginResult{User: user.Name, Connector: ConnectorLocal, Roles: user.Roles, Traits: user.Traits}
	resp, err := s.completeLogin(ctx, res, LoginOutput{PublicKey: req.PublicKey, TTL: req.TTL, WebSession: req.WebSession})
	return resp, trace.Wrap(err)
}

// verifyWebAuthnLogin is FinishWebAuthnLogin up to the issuance: the
// user the assertion proves and the audited method.
func (s *Server) verifyWebAuthnLogin(ctx context.Context, req authapi.MFALoginFinishRequest) (*services.User, string, error) {
	id := req.ChallengeID
	c, session, err := s.takeChallenge(ctx, id, services.MFAPurposeLogin, services.MFAPurposePasswordless)
	if err != nil {
		s.emitLoginMethod(ctx, events.AuthFailed, "", req.RemoteAddr, methodWebAuthn, trace.UserMessage(err))
		return nil, "", trace.Wrap(err)
	}
	method := methodWebAuthn
	if c.Purpose == services.MFAPurposePasswordless {
		method = methodPasswordless
	}
	fail := func(name string, err error) (*services.User, string, error) {
		if name != "" {
			s.limiter.failure(name, req.RemoteAddr)
		}
		s.emitLoginMethod(ctx, events.AuthFailed, name, req.RemoteAddr, method, auditReason(err))
		return nil, "", trace.Wrap(err)
	}
	if c.User != "" {
		if err := s.limiter.check(c.User, req.RemoteAddr); err != nil {
			return fail("", err)
		}
	}
	pref, err := s.authPreference(ctx)
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	rp, err := s.relyingParty(ctx, pref)
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	var user *services.User
	if c.Purpose == services.MFAPurposeLogin {
		if user, err = s.store.GetUser(ctx, c.User); err != nil {
			return fail(c.User, errInvalidCredentials())
		}
		devs, err := s.mfaDevices(ctx, user)
		if err != nil {
			return nil, "", trace.Wrap(err)
		}
		resp := mfaResponse{challenge: c, assertion: req.WebAuthn, remoteAddr: req.RemoteAddr, method: method}
		if _, err := (webAuthnVerifier{s: s, rp: rp}).Verify(ctx, user, devs, resp); err != nil {
			return fail(c.User, err)
		}
	} else {
		if pref == nil || !pref.Spec.Passwordless {
			return fail("", trace.AccessDenied("passwordless login is not enabled (auth_preference passwordless)"))
		}
		parsed, err := protocol.ParseCredentialRequestResponseBytes(req.WebAuthn)
		if err != nil {
			return fail("", trace.BadParameter("invalid passkey answer: %v", protocolDetail(err)))
		}
		var wu *webAuthnUser
		handler := func(rawID, userHandle []byte) (webauthn.User, error) {
			owner, _, err := s.findCredential(ctx, rawID)
			if err != nil {
				return nil, err
			}
			if user, err = s.store.GetUser(ctx, owner); err != nil {
				return nil, err
			}
			if user.Connector != "" {
				return nil, trace.AccessDenied("%q signs in through its identity provider", owner)
			}
			devs, err := s.mfaDevices(ctx, user)
			if err != nil {
				return nil, err
			}
			wu = s.newWebAuthnUser(owner, devs)
			if !bytes.Equal(userHandle, wu.id) {
				return nil, trace.AccessDenied("the passkey's user handle is not its owner's")
			}
			return wu, nil
		}
		_, cred, err := rp.ValidatePasskeyLogin(handler, *session, parsed)
		if err != nil {
			name := ""
			if user != nil {
				name = user.Name
			}
			s.log.WithField("user", name).WithError(err).Info("Refused a passwordless assertion.")
			return fail(name, trace.WithField(trace.AccessDenied("passkey verification failed"), auditReasonField, "passkey: "+protocolDetail(err)))
		}
		if _, err := s.recordPasskeyUse(ctx, wu, cred, req.RemoteAddr, method); err != nil {
			return fail(user.Name, err)
		}
	}
	if pref != nil && pref.Required() && !pref.AllowsWebAuthn() {
		return fail(user.Name, trace.AccessDenied("passkeys are not allowed: auth_preference second_factor is %q", pref.Spec.SecondFactor))
	}
	return user, method, nil
}

// recordPasskeyUse refuses a signature counter that did not go up and
// writes the new one (and the last use) by compare and swap.
func (s *Server) recordPasskeyUse(ctx context.Context, wu *webAuthnUser, cred *webauthn.Credential, remoteAddr, method string) (*services.MFADevice, error) {
	dev := wu.device(cred.ID)
	if dev == nil {
		return nil, trace.AccessDenied("passkey verification failed")
	}
	if cred.Authenticator.CloneWarning {
		s.log.WithFields(map[string]any{"user": wu.name, "device": dev.Name, "stored_count": dev.WebAuthn.SignCount}).Warn("Refused a passkey whose signature counter did not go up: a cloned authenticator or a replay.")
		s.cfg.Audit.Emit(ctx, events.Event{Type: events.MFACloneWarning, User: wu.name, Fields: events.Fields{
			"device": dev.Name, events.FieldRemoteAddr: remoteAddr, events.FieldMethod: method,
		}})
		return nil, trace.WithField(trace.AccessDenied("passkey verification failed"), auditReasonField, "passkey signature counter went backwards")
	}
	after := *dev
	w := *dev.WebAuthn
	w.SignCount = cred.Authenticator.SignCount
	w.BackupState = cred.Flags.BackupState
	after.WebAuthn = &w
	after.LastUsed = s.clock.Now()
	if err := s.store.UpdateMFADevice(ctx, *dev, after); err != nil {
		if trace.IsCompareFailed(err) {
			return nil, trace.WithField(trace.AccessDenied("passkey verification failed"), auditReasonField, "passkey used by another login at the same moment")
		}
		return nil, trace.Wrap(err)
	}
	return &after, nil
}

// webAuthnVerifier checks a passkey's assertion, as the second factor of
// a user the password already named, against that user's passkeys only.
type webAuthnVerifier struct {
	s  *Server
	rp *webauthn.WebAuthn
}

var _ mfaVerifier = webAuthnVerifier{}

// Kind is services.MFAKindWebAuthn.
func (webAuthnVerifier) Kind() string { return services.MFAKindWebAuthn }

// Verify implements mfaVerifier: resp carries the challenge taken from
// the backend and the browser's assertion.
func (v webAuthnVerifier) Verify(ctx context.Context, user *services.User, devs []services.MFADevice, resp mfaResponse) (*services.MFADevice, error) {
	if resp.challenge == nil {
		return nil, trace.BadParameter("a passkey answer needs its challenge")
	}
	var session webauthn.SessionData
	if err := json.Unmarshal(resp.challenge.Session, &session); err != nil {
		return nil, trace.BadParameter("corrupt passkey challenge %q: %v", resp.challenge.ID, err)
	}
	parsed, err := protocol.ParseCredentialRequestResponseBytes(resp.assertion)
	if err != nil {
		return nil, trace.BadParameter("invalid passkey answer: %v", protocolDetail(err))
	}
	wu := v.s.newWebAuthnUser(user.Name, devs)
	cred, err := v.rp.ValidateLogin(wu, session, parsed)
	if err != nil {
		v.s.log.WithField("user", user.Name).WithError(err).Info("Refused a passkey assertion.")
		return nil, trace.WithField(trace.AccessDenied("passkey verification failed"), auditReasonField, "passkey: "+protocolDetail(err))
	}
	dev, err := v.s.recordPasskeyUse(ctx, wu, cred, resp.remoteAddr, resp.method)
	return dev, trace.Wrap(err)
}

// emitLoginMethod records a login attempt that is not a password one.
func (s *Server) emitLoginMethod(ctx context.Context, typ, user, remoteAddr, method, reason string) {
	fields := events.Fields{events.FieldRemoteAddr: remoteAddr, events.FieldMethod: method}
	if reason != "" {
		fields[events.FieldReason] = reason
	}
	s.cfg.Audit.Emit(ctx, events.Event{Type: typ, User: user, Fields: fields})
}
