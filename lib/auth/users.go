package auth

import (
	"context"
	"crypto/subtle"
	"errors"
	"slices"
	"time"

	"github.com/gravitational/trace"
	"github.com/pquerna/otp"
	"github.com/pquerna/otp/totp"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// TOTPIssuer is the issuer name shown by authenticator apps.
const TOTPIssuer = "Postern"

// totpOpts: RFC 6238 defaults (30 s, 6 digits, SHA-1), which is what every
// authenticator app implements, with one period of skew either way for
// phones whose clocks drift.
var totpOpts = totp.ValidateOpts{Period: 30, Skew: 1, Digits: otp.DigitsSix, Algorithm: otp.AlgorithmSHA1}

// errInvalidCredentials is the one answer to every failed login: unknown
// user, wrong password, missing or wrong OTP. A distinct answer for each
// would tell a guesser which user names exist.
func errInvalidCredentials() error { return trace.AccessDenied("invalid credentials") }

// auditReasonField carries, on a refused login's error, the reason the
// audit log records when it is more specific than what the caller is told.
// The caller always sees "invalid credentials" (nothing to probe with),
// but an operator must be able to tell a replayed one-time code (a
// phished or shoulder-surfed code, or a client that resent the login) from
// a typo.
const auditReasonField = "audit_reason"

// auditReasonOTPReplayed is the audited reason of a login refused because
// its TOTP code was already accepted once.
const auditReasonOTPReplayed = "otp code already used"

// errOTPReplayed is errInvalidCredentials carrying auditReasonOTPReplayed.
func errOTPReplayed() error {
	return trace.WithField(trace.Wrap(errInvalidCredentials()), auditReasonField, auditReasonOTPReplayed)
}

// auditReason is the reason to audit for a refused login: the one err
// carries, else its generic "invalid credentials".
func auditReason(err error) string {
	var te trace.Error
	if errors.As(err, &te) {
		if r, ok := te.GetFields()[auditReasonField].(string); ok && r != "" {
			return r
		}
	}
	return "invalid credentials"
}

// CreateUser adds a user with a bcrypt-hashed password. logins become the
// user's logins trait; roles default to ["access"] and must exist. With
// withOTP a TOTP secret is generated and its otpauth:// URL returned (show
// it once: it is the only time the secret leaves the server).
func (s *Server) CreateUser(ctx context.Context, name string, password []byte, logins []string, roles []string, withOTP bool) (totpURL string, err error) {
	if err := services.CheckUserName(name); err != nil {
		return "", trace.Wrap(err)
	}
	if len(password) == 0 {
		return "", trace.BadParameter("missing password for user %q", name)
	}
	if len(roles) == 0 {
		roles = []string{services.PresetAccessRole}
	}
	for _, r := range roles {
		if _, err := s.store.GetRole(ctx, r); err != nil {
			if trace.IsNotFound(err) {
				return "", trace.NotFound("role %q does not exist", r)
			}
			return "", trace.Wrap(err)
		}
	}
	for _, l := range logins {
		if err := services.CheckLogin(l); err != nil {
			return "", trace.Wrap(err)
		}
	}
	hash, err := bcrypt.GenerateFromPassword(password, s.cfg.BcryptCost)
	if errors.Is(err, bcrypt.ErrPasswordTooLong) {
		return "", trace.BadParameter("password is too long: at most 72 bytes")
	}
	if err != nil {
		return "", trace.Wrap(err)
	}
	user := services.User{
		Name:         name,
		PasswordHash: hash,
		Roles:        slices.Clone(roles),
		Created:      s.clock.Now().UTC(),
	}
	if len(logins) > 0 {
		user.Traits = map[string][]string{services.TraitLogins: slices.Clone(logins)}
	}
	if withOTP {
		key, err := totp.Generate(totp.GenerateOpts{Issuer: TOTPIssuer, AccountName: name + "@" + s.cfg.ClusterName})
		if err != nil {
			return "", trace.Wrap(err)
		}
		user.TOTPSecret = key.Secret()
		totpURL = key.URL()
	}
	if err := s.store.CreateUser(ctx, user); err != nil {
		if trace.IsAlreadyExists(err) {
			return "", trace.AlreadyExists("user %q already exists", name)
		}
		return "", trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"user": name, "roles": roles, "otp": withOTP}).Info("Created user.")
	return totpURL, nil
}

// DeleteUser removes a user and locks the name for DeletedUserLockTTL, so
// the certificates and web sessions already issued stop working at once on
// every proxy and node, open connections included.
func (s *Server) DeleteUser(ctx context.Context, name string) error {
	// Lock first: the user's certificates and web sessions outlive the
	// record, and the lock is what every proxy and node acts on.
	if _, err := s.store.GetUser(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	if err := s.lockDeletedUser(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	if err := s.store.DeleteUser(ctx, name); err != nil {
		if trace.IsNotFound(err) {
			return trace.NotFound("user %q not found", name)
		}
		return trace.Wrap(err)
	}
	// A user created again under this name must not inherit passkeys.
	return trace.Wrap(s.store.DeleteMFADevices(ctx, name))
}

// ListUsers returns every user without secrets (password hash, TOTP secret).
func (s *Server) ListUsers(ctx context.Context) ([]services.User, error) {
	users, err := s.store.GetUsers(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for i := range users {
		devs, err := s.mfaDevices(ctx, &users[i])
		if err != nil {
			return nil, trace.Wrap(err)
		}
		users[i] = publicUser(users[i])
		users[i].MFA = MFASummary(devs)
		for _, d := range devs {
			if d.Kind == services.MFAKindTOTP {
				users[i].OTPEnabled = true
			}
		}
	}
	return users, nil
}

func publicUser(u services.User) services.User {
	u.OTPEnabled = u.TOTPSecret != ""
	u.PasswordHash = nil
	u.TOTPSecret = ""
	return u
}

// AuthenticateUser checks a password (and OTP) with the local connector
// and returns the user's record without secrets: the auth API's
// /v1/users/authenticate, for callers that issue nothing.
func (s *Server) AuthenticateUser(ctx context.Context, req authapi.AuthRequest) (*services.User, error) {
	user, err := s.local.authenticate(ctx, req)
	return user, trace.Wrap(err)
}

// emitLogin records a login attempt. The user is the name that was tried,
// which for a failure may not exist: that is what an operator needs to see.
func (s *Server) emitLogin(ctx context.Context, typ string, req authapi.AuthRequest, reason string) {
	fields := events.Fields{events.FieldRemoteAddr: req.RemoteAddr, events.FieldMethod: "password"}
	if reason != "" {
		fields[events.FieldReason] = reason
	}
	s.cfg.Audit.Emit(ctx, events.Event{Type: typ, User: req.User, Fields: fields})
}

func (s *Server) checkCredentials(ctx context.Context, req authapi.AuthRequest) (*services.User, error) {
	user, err := s.checkPassword(ctx, req)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.checkSecondFactor(ctx, user, req.OTP); err != nil {
		if isMustRegister(err) {
			// The password was right: the caller may open a
			// register-only session for this user.
			out := publicUser(*user)
			return &out, trace.Wrap(err)
		}
		return nil, trace.Wrap(err)
	}
	out := publicUser(*user)
	return &out, nil
}

// checkPassword checks req's user and password only and returns the
// user's record, secrets included.
func (s *Server) checkPassword(ctx context.Context, req authapi.AuthRequest) (*services.User, error) {
	var user *services.User
	var err error
	if services.CheckUserName(req.User) == nil {
		user, err = s.store.GetUser(ctx, req.User)
		if err != nil && !trace.IsNotFound(err) {
			return nil, trace.Wrap(err)
		}
	}
	hash := s.dummyHash
	if user != nil {
		hash = user.PasswordHash
	}
	// Always pay for one bcrypt comparison so response time does not tell
	// whether the user exists.
	pwErr := bcrypt.CompareHashAndPassword(hash, []byte(req.Password))
	if user == nil || pwErr != nil {
		return nil, errInvalidCredentials()
	}
	return user, nil
}

// spendOTP records that user's code for time step step was accepted and
// refuses a code already used by this user (RFC 6238 section 5.2: a
// verifier must not accept the second attempt of the same OTP). Every
// accepted code is remembered in the backend for as long as it could be
// accepted (one item per user and time step, created atomically), so
// neither an older code after a newer one, nor the same code at another
// auth server sharing the backend, gets in twice.
func (s *Server) spendOTP(ctx context.Context, user string, step int64) error {
	err := s.store.MarkOTPUsed(ctx, user, step, otpUsedUntil(step))
	if trace.IsAlreadyExists(err) {
		s.log.WithField("user", user).Warn("Refused a one-time password that was already used.")
		return errOTPReplayed()
	}
	return trace.Wrap(err)
}

// matchTOTPStep finds the time step, within the skew around now, whose
// code is code. Each step is compared in constant time, and all of them
// are, so timing does not say which step matched.
func matchTOTPStep(secret, code string, now time.Time) (int64, bool) {
	period := int64(totpOpts.Period)
	current := now.Unix() / period
	var matched int64
	found := 0
	for d := -int64(totpOpts.Skew); d <= int64(totpOpts.Skew); d++ {
		step := current + d
		want, err := totp.GenerateCodeCustom(secret, time.Unix(step*period, 0), totpOpts)
		if err != nil {
			return 0, false
		}
		if subtle.ConstantTimeCompare([]byte(want), []byte(code)) == 1 && found == 0 {
			matched, found = step, 1
		}
	}
	return matched, found == 1
}

// otpUsedUntil is when a used code of step can no longer be accepted
// anywhere: the last moment the step is within the skew is the end of step
// step+skew; one more period covers clock differences between auth servers
// sharing the backend. The validity window is thus
// period x (2 x skew + 1) and the record outlives it.
func otpUsedUntil(step int64) time.Time {
	period := int64(totpOpts.Period)
	return time.Unix((step+int64(totpOpts.Skew)+2)*period, 0)
}

// ClearLockout clears the login limiter's counts and lockouts for user,
// from every address, and for remoteAddr's address when it is not empty:
// the admin's way out of a lockout (`pctl users clear-lockout`). (Not to
// be confused with `pctl unlock`, which lifts an admin's lock.) It reports whether
// anything was locked or counted. The limiter lives in this auth server's
// memory: with several auth servers, call each (or wait out the window).
func (s *Server) ClearLockout(_ context.Context, name, remoteAddr string) (bool, error) {
	if name == "" {
		return false, trace.BadParameter("clear lockout: missing user name")
	}
	n := s.limiter.clear(name, remoteAddr)
	s.log.WithFields(map[string]any{"user": name, "remote_addr": remoteAddr, "cleared": n}).Info("Cleared login lockouts.")
	return n > 0, nil
}

// AuthenticateSSHUser logs a user in with a password (and second factor)
// and certifies their key: what the proxy's /webapi/ssh/certs does.
func (s *Server) AuthenticateSSHUser(ctx context.Context, req authapi.SSHLoginRequest) (*authapi.SSHLoginResponse, error) {
	if _, err := parseAuthorizedKey(req.PublicKey); err != nil {
		return nil, trace.Wrap(err)
	}
	// Only a browser login may end in a register-only session: psh has
	// nowhere to register a passkey.
	user, registerOnly, err := s.local.authenticateFor(ctx, req.AuthRequest, req.WebSession != nil)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if registerOnly {
		resp, err := s.registerOnlyLogin(ctx, user, req.WebSession)
		return resp, trace.Wrap(err)
	}
	res := &LoginResult{User: user.Name, Connector: ConnectorLocal, Roles: user.Roles, Traits: user.Traits}
	resp, err := s.completeLogin(ctx, res, LoginOutput{PublicKey: req.PublicKey, TTL: req.TTL, WebSession: req.WebSession})
	return resp, trace.Wrap(err)
}
