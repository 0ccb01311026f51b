package auth

import (
	"context"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// The login seam. A connector proves who is logging in, in its own way (a
// password and a second factor checked here, an identity provider's
// signed token, a passkey), and says so in one LoginResult; completeLogin
// turns any LoginResult into what a login issues (a user certificate, a
// web session, the host CAs to trust). Issuance never learns how the
// credentials were checked, so a new connector adds a way in without
// touching what is issued, and every way in gets the same lock, role and
// TTL checks.

// LoginResult is what a connector proves about a login.
type LoginResult struct {
	// User is the Postern user name the certificate is issued to.
	User string
	// Connector names what checked the credentials, for audit and for
	// the user's record: ConnectorLocal, or TYPE:NAME for an external
	// one.
	Connector string
	// Roles are the roles this login grants (a local user's stored roles;
	// for an identity provider, what its claims map to at this login).
	Roles []string
	// Traits expand role templates ({{internal.logins}}, and an identity
	// provider's claims).
	Traits map[string][]string
	// Expires, when not zero, caps the certificate and web session below
	// what the roles allow: a login can never outlive what proved it
	// (an identity provider's session, say). Zero: the roles decide.
	Expires time.Time
}

// ConnectorLocal is the connector of users kept in Postern's own store,
// logging in with a password and, where enrolled, a second factor.
const ConnectorLocal = "local"

// user is the identity issuance works on. It carries no secrets: issuance
// needs none.
func (r *LoginResult) user() *services.User {
	return &services.User{Name: r.User, Roles: r.Roles, Traits: r.Traits}
}

// CredentialChecker is a connector that checks credentials carried by one
// request: the local password and second factor. (An identity provider's
// connector answers a redirect instead; it produces the same LoginResult.)
type CredentialChecker interface {
	// Name is the connector's name in LoginResult.Connector.
	Name() string
	// Authenticate checks req's credentials. Every credential failure is
	// the same AccessDenied("invalid credentials"); a lockout is an
	// authapi.RetryAfterError; a locked user who proved their
	// credentials gets the lock's refusal (services.LockDenied) from
	// completeLogin, not from here.
	Authenticate(ctx context.Context, req authapi.AuthRequest) (*LoginResult, error)
}

// LoginOutput is what a login asks to be issued.
type LoginOutput struct {
	// PublicKey is the SSH public key to certify (authorized_keys form).
	PublicKey []byte
	// TTL, when positive, shortens the certificate below what the roles
	// (and LoginResult.Expires) allow.
	TTL time.Duration
	// WebSession, when set, is the browser session to create with the
	// certificate's lifetime.
	WebSession *authapi.WebSessionInit
}

// completeLogin issues what out asks for to the login res proved: the one
// path from every connector to a certificate and a web session. Locks,
// roles that no longer exist and max_session_ttl apply here, whatever the
// connector.
func (s *Server) completeLogin(ctx context.Context, res *LoginResult, out LoginOutput) (*authapi.SSHLoginResponse, error) {
	if res == nil || res.User == "" {
		return nil, trace.BadParameter("login result names no user")
	}
	ttl := out.TTL
	if !res.Expires.IsZero() {
		left := res.Expires.Sub(s.clock.Now())
		if left <= 0 {
			return nil, trace.AccessDenied("the login expired before it was completed")
		}
		if ttl <= 0 || left < ttl {
			ttl = left
		}
	}
	user := res.user()
	cert, err := s.generateUserCert(ctx, user, authapi.UserCertRequest{User: user.Name, PublicKey: out.PublicKey, TTL: ttl})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if out.WebSession != nil {
		if err := s.createWebSession(ctx, user.Name, out.WebSession, cert); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	signers, err := s.hostSigners(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &authapi.SSHLoginResponse{Username: user.Name, Cert: cert, HostSigners: signers}, nil
}

// localConnector checks a local user's password and TOTP code, behind the
// login limiter, and audits every attempt.
type localConnector struct {
	s *Server
}

var _ CredentialChecker = localConnector{}

// Name is ConnectorLocal.
func (localConnector) Name() string { return ConnectorLocal }

// Authenticate implements CredentialChecker.
func (c localConnector) Authenticate(ctx context.Context, req authapi.AuthRequest) (*LoginResult, error) {
	user, err := c.authenticate(ctx, req)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &LoginResult{User: user.Name, Connector: ConnectorLocal, Roles: user.Roles, Traits: user.Traits}, nil
}

// authenticate is Authenticate returning the user's record (without
// secrets). Repeated failures for a user or from an address are refused
// with a RetryAfterError before any check runs.
func (c localConnector) authenticate(ctx context.Context, req authapi.AuthRequest) (*services.User, error) {
	user, _, err := c.authenticateFor(ctx, req, false)
	return user, trace.Wrap(err)
}

// authenticateFor is authenticate for a login that may end in a
// register-only web session: with allowRegister, a user whose password
// is right but who has no second factor while one is required (and may
// register a passkey) is let through with registerOnly set, audited as a
// login of that kind.
func (c localConnector) authenticateFor(ctx context.Context, req authapi.AuthRequest, allowRegister bool) (user *services.User, registerOnly bool, err error) {
	s := c.s
	if err := s.limiter.check(req.User, req.RemoteAddr); err != nil {
		s.emitLogin(ctx, events.AuthFailed, req, trace.UserMessage(err))
		return nil, false, trace.Wrap(err)
	}
	user, err = s.checkCredentials(ctx, req)
	if allowRegister && isMustRegister(err) && user != nil {
		s.limiter.success(req.User, req.RemoteAddr)
		s.log.WithFields(map[string]any{"user": req.User, "remote_addr": req.RemoteAddr}).Info("Password login of a user without a second factor: register-only web session.")
		s.cfg.Audit.Emit(ctx, events.Event{Type: events.AuthLogin, User: req.User, Fields: events.Fields{
			events.FieldRemoteAddr: req.RemoteAddr, events.FieldMethod: "password", fieldRegisterOnly: true,
		}})
		return user, true, nil
	}
	if err != nil {
		if trace.IsAccessDenied(err) {
			s.limiter.failure(req.User, req.RemoteAddr)
			s.log.WithFields(map[string]any{"user": req.User, "remote_addr": req.RemoteAddr}).Info("Failed login.")
			s.emitLogin(ctx, events.AuthFailed, req, auditReason(err))
		}
		return nil, false, trace.Wrap(err)
	}
	s.limiter.success(req.User, req.RemoteAddr)
	s.emitLogin(ctx, events.AuthLogin, req, "")
	return user, false, nil
}
