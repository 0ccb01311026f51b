package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/api"
	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/services"
)

// SSHLoginAuthenticator is what the login endpoints need from auth: both
// *auth.Server (auth in the same process) and *auth.Client (auth on
// another machine, called with the proxy's identity) provide it. A login
// with a password and one through an identity provider (sso.go) are two
// doors into the same auth server, so one value serves both.
type SSHLoginAuthenticator interface {
	AuthenticateSSHUser(ctx context.Context, req authapi.SSHLoginRequest) (*authapi.SSHLoginResponse, error)
	SSOAuthenticator
}

var (
	_ SSHLoginAuthenticator = (*auth.Server)(nil)
	_ SSHLoginAuthenticator = (*auth.Client)(nil)
)

// maxLoginBody bounds a login request: user, password, a 6-digit OTP and
// one public key fit in well under 16 KiB (an RSA-8192 authorized_keys line
// is ~1.4 KiB); anything larger is not a login.
const maxLoginBody = 16 << 10

// maxTTLSeconds bounds ttl_seconds before it is turned into a Duration
// (so a huge value cannot overflow); a year is far beyond any role's
// max_session_ttl, which caps the real lifetime anyway.
const maxTTLSeconds = 365 * 24 * 3600

// msgInvalidCredentials is the one answer to a failed login: it never
// says whether the user exists, the password was wrong or an OTP missing.
const msgInvalidCredentials = "invalid credentials"

// msgAuthUnavailable answers a login that failed because auth (or its
// backend) did not answer: the user should retry later, not doubt their
// password, and an operator reading it knows where to look.
const msgAuthUnavailable = "the auth server is unavailable; try again later"

// loginTimeout bounds one login's call to auth. Without it a login waits
// as long as the browser or psh keeps the request open when the backend
// stops answering (an etcd client waits for a connection until its
// context ends), and the user learns nothing. It is far above a normal
// login (a bcrypt check and a few backend reads) and below
// auth.DefaultClientTimeout, so the caller hears msgAuthUnavailable rather
// than its own timeout. Real time, like the auth client's own bound.
const loginTimeout = 10 * time.Second

// defaultRetryAfter is the Retry-After sent with a 429 when auth's refusal
// names no wait (an older auth server's).
const defaultRetryAfter = time.Minute

// DecodeSSHLoginRequest parses and validates a login body: one JSON object,
// no unknown fields, no trailing data, a TTL in range.
func DecodeSSHLoginRequest(data []byte) (*webapi.SSHLoginRequest, error) {
	var req webapi.SSHLoginRequest
	if err := api.UnmarshalStrict(data, &req); err != nil {
		return nil, trace.BadParameter("invalid login request: %v", trace.UserMessage(err))
	}
	if req.User == "" {
		return nil, trace.BadParameter("invalid login request: missing user")
	}
	if req.PubKey == "" {
		return nil, trace.BadParameter("invalid login request: missing pub_key")
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > maxTTLSeconds {
		return nil, trace.BadParameter("invalid login request: ttl_seconds must be between 0 and %d", maxTTLSeconds)
	}
	return &req, nil
}

// sshCerts serves POST /webapi/ssh/certs.
func (s *Server) sshCerts(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Auth == nil {
		writeError(w, http.StatusNotImplemented, "login is not available on this proxy")
		return
	}
	data, ok := readLoginBody(w, r)
	if !ok {
		return
	}
	req, err := DecodeSSHLoginRequest(data)
	if err != nil {
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
		return
	}
	remote := remoteHost(r.RemoteAddr)
	log := s.cfg.Logger.WithFields(logrus.Fields{"user": req.User, "remote_addr": remote})
	resp, ok := s.authenticateSSHUser(w, r, log, authapi.SSHLoginRequest{
		AuthRequest: authapi.AuthRequest{User: req.User, Password: req.Password, OTP: req.OTPToken, RemoteAddr: remote},
		PublicKey:   []byte(req.PubKey),
		TTL:         time.Duration(req.TTLSeconds) * time.Second,
	})
	if !ok {
		return
	}
	log.Info("Issued a user certificate.")
	writeJSON(w, http.StatusOK, webapi.SSHLoginResponse{
		Username:    resp.Username,
		Cert:        string(bytes.TrimSpace(resp.Cert)),
		HostSigners: resp.HostSigners,
	})
}

// retryAfter is how long a rate-limited login should wait: the wait auth
// named (authapi.RetryAfterError, in this process or across the wire),
// rounded up to whole seconds, else defaultRetryAfter.
func retryAfter(err error) time.Duration {
	wait, ok := authapi.RetryAfterOf(err)
	if !ok || wait <= 0 {
		return defaultRetryAfter
	}
	if whole := wait.Truncate(time.Second); whole != wait {
		return whole + time.Second
	}
	return wait
}

// remoteHost is the address part of RemoteAddr: the per-address login
// limit counts hosts, not ephemeral ports.
func remoteHost(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	return host
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, webapi.ErrorResponse{Error: msg})
}

// readLoginBody reads a login request's body, at most maxLoginBody bytes,
// for both login endpoints. ok is false when the answer (413, or 400 for a
// body that could not be read) has been written.
func readLoginBody(w http.ResponseWriter, r *http.Request) (data []byte, ok bool) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxLoginBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "could not read request body")
		return nil, false
	}
	return data, true
}

// internalError answers 500 for a fault the user cannot fix and logs its
// cause under a fresh request id that the answer names: the user learns
// nothing of the cause (it may name the backend, a file or a key), but
// the id in their report finds the one log line that explains it. msg is
// the log message.
func internalError(w http.ResponseWriter, log logrus.FieldLogger, msg string, cause error) {
	id := newRequestID()
	log.WithError(cause).WithField("request_id", id).Warn(msg)
	writeError(w, http.StatusInternalServerError, fmt.Sprintf("internal error (request id %s); see the proxy's log", id))
}

// newRequestID is 8 random bytes in hex: unique enough to find one line
// in a proxy's log, short enough to read out over the phone.
func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+).
	return hex.EncodeToString(b[:])
}

// authenticateSSHUser asks auth to check a login and certify its key, and
// answers the HTTP errors itself, the same way for the CLI login and the
// browser login: one generic 401 for every credential problem, 403 with
// the lock's refusal for a locked user who proved their password, 429 with
// Retry-After when rate limited, 503 when auth cannot be reached. The call
// is bounded (loginTimeout) so a stalled backend is an answer, not a hang.
// ok is false when the response has been written.
func (s *Server) authenticateSSHUser(w http.ResponseWriter, r *http.Request, log logrus.FieldLogger, req authapi.SSHLoginRequest) (resp *authapi.SSHLoginResponse, ok bool) {
	return s.callLogin(w, r, log, func(ctx context.Context) (*authapi.SSHLoginResponse, error) {
		return s.cfg.Auth.AuthenticateSSHUser(ctx, req)
	})
}

// callLogin runs one login call to auth (a password login, or the finish
// of a passkey login) under loginTimeout and answers its errors as
// authenticateSSHUser says.
func (s *Server) callLogin(w http.ResponseWriter, r *http.Request, log logrus.FieldLogger, login func(context.Context) (*authapi.SSHLoginResponse, error)) (resp *authapi.SSHLoginResponse, ok bool) {
	ctx, cancel := context.WithTimeout(r.Context(), loginTimeout)
	defer cancel()
	resp, err := login(ctx)
	switch {
	case err == nil:
		return resp, true
	case trace.IsLimitExceeded(err):
		log.Info("Login rate limited.")
		w.Header().Set("Retry-After", strconv.Itoa(int(retryAfter(err).Seconds())))
		writeError(w, http.StatusTooManyRequests, "too many failed login attempts; try again later")
	case services.IsLocked(err):
		// Auth says "locked" only after the password and second factor
		// were right (services.LockDenied): the user may learn why.
		log.Info("Login refused: access is locked.")
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
	case trace.IsAccessDenied(err), trace.IsNotFound(err):
		log.Info("Login failed.")
		writeError(w, http.StatusUnauthorized, msgInvalidCredentials)
	case trace.IsConnectionProblem(err):
		log.WithError(err).Warn("Login failed: auth unavailable.")
		writeError(w, http.StatusServiceUnavailable, msgAuthUnavailable)
	case trace.IsBadParameter(err):
		// A malformed key, or a user without logins: the caller's fault
		// and safe to show (auth checks the key before the password, and
		// only says "no logins" after a correct password).
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
	default:
		internalError(w, log, "Login failed with an internal error.", err)
	}
	return nil, false
}
