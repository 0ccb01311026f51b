package auth

import (
	"context"
	"errors"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// Register-only web sessions. When auth_preference requires a second
// factor, a user who has none (a new user, or one whose factors an admin
// reset) could never log in again. Such a user, once their password is
// proven in a browser, gets a web session that can do one thing: register
// a passkey. Auth certifies no key for it (WebSessionCerts refuses it), so
// no proxy can reach a node with it, and the proxy refuses every other
// call. Registering ends the session: the user then logs in with the
// password and the new passkey, as every later login will. The session is
// not upgraded in place, so a full session always rests on a login that
// presented the second factor, which is what an operator who turned the
// requirement on expects (and what the audit log then shows).

// RegisterOnlyTTL bounds a register-only session: time to find a security
// key and name it, not a session to keep open.
const RegisterOnlyTTL = 15 * time.Minute

// fieldRegisterOnly marks, on the refusal of checkSecondFactor, a user
// who may open a register-only session, and in the audit of such a login.
const fieldRegisterOnly = "register_only"

// errMustRegister refuses a login whose user has no second factor while
// one is required and could register a passkey; the caller of a browser
// login turns it into a register-only session.
func errMustRegister() error {
	err := trace.AccessDenied("a second factor is required and none is registered for this account: log in on the web page once to register a passkey")
	return trace.WithField(trace.WithField(trace.Wrap(err), fieldRegisterOnly, true), auditReasonField, "no second factor registered")
}

// isMustRegister reports errMustRegister.
func isMustRegister(err error) bool {
	var te trace.Error
	if errors.As(err, &te) {
		v, _ := te.GetFields()[fieldRegisterOnly].(bool)
		return v
	}
	return false
}

// canRegisterFirstFactor says whether user, without a usable factor, may
// register one in a register-only session: passkeys must be allowed (a
// TOTP is enrolled by an admin) and the user must be local (an identity
// provider's user has its own second factor there).
func canRegisterFirstFactor(pref *services.AuthPreference, user *services.User) bool {
	return pref != nil && pref.Required() && pref.AllowsWebAuthn() && user.Connector == ""
}

// registerOnlyLogin creates the register-only session init names for
// user, whose password was proven.
func (s *Server) registerOnlyLogin(ctx context.Context, user *services.User, init *authapi.WebSessionInit) (*authapi.SSHLoginResponse, error) {
	if init == nil {
		return nil, trace.BadParameter("a register-only login needs the web session to create")
	}
	if err := s.checkUserLock(ctx, user.Name); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.createWebSessionRecord(ctx, user.Name, init, s.clock.Now().Add(RegisterOnlyTTL), true); err != nil {
		return nil, trace.Wrap(err)
	}
	return &authapi.SSHLoginResponse{Username: user.Name, RegisterOnly: true}, nil
}

// endRegisterOnly deletes a register-only session once its factor is
// registered: the user logs in again, with it.
func (s *Server) endRegisterOnly(ctx context.Context, ref authapi.WebSessionRequest) {
	key, ws, err := s.webSessionBySecret(ctx, ref.SessionID, ref.Token)
	if err != nil || !ws.RegisterOnly {
		return
	}
	if err := s.store.DeleteWebSession(ctx, key); err != nil && !trace.IsNotFound(err) {
		s.log.WithError(err).WithField("user", ws.User).Warn("Could not end a register-only web session.")
		return
	}
	s.log.WithField("user", ws.User).Info("Ended a register-only web session: its factor is registered.")
}
