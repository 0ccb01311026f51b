package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/api"
	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/auth"
)

// Passkeys in the browser: the WebAuthn ceremonies (login, and adding one
// to the logged-in user's account) and the user's own second factors.
// The proxy only carries the browser's JSON to auth and back: auth checks
// everything and keeps the challenges, so a ceremony begun through one
// proxy may finish through another.

// MFAAuthenticator is what these endpoints need from auth. The Auth value
// of Config provides it when it is the real thing (*auth.Server or
// *auth.Client); a narrower value (a test's fake of the password login)
// leaves the endpoints answering 501.
type MFAAuthenticator interface {
	BeginWebAuthnLogin(ctx context.Context, req authapi.MFALoginBeginRequest) (*authapi.MFAChallenge, error)
	FinishWebAuthnLogin(ctx context.Context, req authapi.MFALoginFinishRequest) (*authapi.SSHLoginResponse, error)
	BeginWebAuthnRegistration(ctx context.Context, req authapi.MFARegisterBeginRequest) (*authapi.MFAChallenge, error)
	FinishWebAuthnRegistration(ctx context.Context, req authapi.MFAFinishRequest) (*authapi.MFADevice, error)
	ListMFADevices(ctx context.Context, ref authapi.WebSessionRequest) ([]authapi.MFADevice, error)
	RenameMFADevice(ctx context.Context, req authapi.MFADeviceRequest) error
	DeleteMFADevice(ctx context.Context, req authapi.MFADeviceRequest) error
}

var (
	_ MFAAuthenticator = (*auth.Server)(nil)
	_ MFAAuthenticator = (*auth.Client)(nil)
)

// maxWebAuthnBody bounds a ceremony's body: an attestation object with
// attestation "none" is a few hundred bytes, an assertion less; 64 KiB
// leaves room for large COSE keys and extensions, not for abuse.
const maxWebAuthnBody = 64 << 10

// Bodies of the browser's calls.
type (
	// mfaLoginBeginBody: {user, password} or {passwordless: true}.
	mfaLoginBeginBody struct {
		User         string `json:"user,omitempty"`
		Password     string `json:"password,omitempty"`
		Passwordless bool   `json:"passwordless,omitempty"`
	}
	// mfaFinishBody: the challenge and the browser's PublicKeyCredential.
	mfaFinishBody struct {
		ChallengeID string          `json:"challenge_id"`
		WebAuthn    json.RawMessage `json:"webauthn"`
	}
	// mfaRegisterBeginBody names the new passkey.
	mfaRegisterBeginBody struct {
		Name string `json:"name"`
	}
	// mfaRenameBody is a device's new name.
	mfaRenameBody struct {
		Name string `json:"name"`
	}
)

func (s *Server) mfaAuth(w http.ResponseWriter) (MFAAuthenticator, bool) {
	m, ok := s.cfg.Auth.(MFAAuthenticator)
	if !ok || s.cfg.Auth == nil || !s.cfg.WebSessions.enabled() {
		writeError(w, http.StatusNotImplemented, "passkeys are not available on this proxy")
		return nil, false
	}
	return m, true
}

// readMFABody decodes a ceremony body strictly, at most maxWebAuthnBody
// bytes; ok is false when the answer (413 or 400) has been written.
func readMFABody(w http.ResponseWriter, r *http.Request, v any) bool {
	data, ok := readMFABodyBytes(w, r)
	if !ok {
		return false
	}
	if err := api.UnmarshalStrict(data, v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request: "+trace.UserMessage(err))
		return false
	}
	return true
}

// readMFABodyBytes reads a body that may carry a passkey's answer, at
// most maxWebAuthnBody bytes; ok is false when the answer has been
// written.
func readMFABodyBytes(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebAuthnBody))
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

// writeMFAError maps auth's answer for the browser: a refused ceremony is
// 401 with auth's reason (it names no other user and nothing the caller
// did not send), bad input 400, auth away 503.
func writeMFAError(w http.ResponseWriter, log logrus.FieldLogger, err error) {
	switch {
	case trace.IsAccessDenied(err):
		writeError(w, http.StatusUnauthorized, trace.UserMessage(err))
	case trace.IsLimitExceeded(err):
		w.Header().Set("Retry-After", strconv.Itoa(int(retryAfter(err).Seconds())))
		writeError(w, http.StatusTooManyRequests, "too many failed login attempts; try again later")
	case trace.IsBadParameter(err):
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
	case trace.IsNotFound(err):
		writeError(w, http.StatusNotFound, trace.UserMessage(err))
	case trace.IsAlreadyExists(err):
		writeError(w, http.StatusConflict, trace.UserMessage(err))
	case trace.IsConnectionProblem(err):
		writeError(w, http.StatusServiceUnavailable, msgAuthUnavailable)
	default:
		internalError(w, log, "Passkey call failed with an internal error.", err)
	}
}

// mfaLoginBegin serves POST /webapi/mfa/login/begin.
func (s *Server) mfaLoginBegin(w http.ResponseWriter, r *http.Request) {
	m, ok := s.mfaAuth(w)
	if !ok {
		return
	}
	if err := checkLoginOrigin(r); err != nil {
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
		return
	}
	var body mfaLoginBeginBody
	if !readMFABody(w, r, &body) {
		return
	}
	remote := remoteHost(r.RemoteAddr)
	log := s.cfg.Logger.WithFields(logrus.Fields{"user": body.User, "remote_addr": remote})
	ctx, cancel := context.WithTimeout(r.Context(), loginTimeout)
	defer cancel()
	ch, err := m.BeginWebAuthnLogin(ctx, authapi.MFALoginBeginRequest{
		User: body.User, Password: body.Password, Passwordless: body.Passwordless, RemoteAddr: remote,
	})
	if err != nil {
		if trace.IsAccessDenied(err) && !body.Passwordless {
			// The password step: one answer for every failure.
			writeError(w, http.StatusUnauthorized, msgInvalidCredentials)
			return
		}
		writeMFAError(w, log, err)
		return
	}
	writeJSON(w, http.StatusOK, ch)
}

// mfaLoginFinish serves POST /webapi/mfa/login/finish: on success the
// browser has a web session, as after POST /webapi/sessions.
func (s *Server) mfaLoginFinish(w http.ResponseWriter, r *http.Request) {
	m, ok := s.mfaAuth(w)
	if !ok {
		return
	}
	if err := checkLoginOrigin(r); err != nil {
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
		return
	}
	var body mfaFinishBody
	if !readMFABody(w, r, &body) {
		return
	}
	remote := remoteHost(r.RemoteAddr)
	log := s.cfg.Logger.WithFields(logrus.Fields{"remote_addr": remote, "method": "webauthn"})
	s.issueWebSession(w, r, log, func(ctx context.Context, pub []byte, ttl time.Duration, init *authapi.WebSessionInit) (*authapi.SSHLoginResponse, error) {
		return m.FinishWebAuthnLogin(ctx, authapi.MFALoginFinishRequest{
			ChallengeID: body.ChallengeID, WebAuthn: body.WebAuthn, PublicKey: pub, TTL: ttl, WebSession: init, RemoteAddr: remote,
		})
	})
}

// sessionRequest names a live session to auth by its secrets.
func sessionRequest(live *liveSession) authapi.WebSessionRequest {
	return authapi.WebSessionRequest{SessionID: live.ref.ID, Token: live.ref.Token}
}

// mfaRegisterBegin serves POST /webapi/mfa/register/begin.
func (s *Server) mfaRegisterBegin(w http.ResponseWriter, r *http.Request, live *liveSession) {
	m, ok := s.mfaAuth(w)
	if !ok {
		return
	}
	var body mfaRegisterBeginBody
	if !readMFABody(w, r, &body) {
		return
	}
	ch, err := m.BeginWebAuthnRegistration(r.Context(), authapi.MFARegisterBeginRequest{WebSessionRequest: sessionRequest(live), DeviceName: body.Name})
	if err != nil {
		writeMFAError(w, s.cfg.Logger.WithField("user", live.user), err)
		return
	}
	writeJSON(w, http.StatusOK, ch)
}

// mfaRegisterFinish serves POST /webapi/mfa/register/finish.
func (s *Server) mfaRegisterFinish(w http.ResponseWriter, r *http.Request, live *liveSession) {
	m, ok := s.mfaAuth(w)
	if !ok {
		return
	}
	var body mfaFinishBody
	if !readMFABody(w, r, &body) {
		return
	}
	dev, err := m.FinishWebAuthnRegistration(r.Context(), authapi.MFAFinishRequest{
		WebSessionRequest: sessionRequest(live), ChallengeID: body.ChallengeID, WebAuthn: body.WebAuthn,
	})
	if err != nil {
		writeMFAError(w, s.cfg.Logger.WithField("user", live.user), err)
		return
	}
	if live.registerOnly {
		// The factor is there: the user now logs in with it.
		s.endRegisterOnly(r.Context(), live)
		clearSessionCookie(w, sessionCookieFor(bearerToken(r)))
		clearSessionCookie(w, SessionCookieName)
		writeJSON(w, http.StatusOK, registeredDevice{MFADevice: *dev, Relogin: true})
		return
	}
	writeJSON(w, http.StatusOK, dev)
}

// registeredDevice answers the registration of a register-only session:
// the new device, and that the session ended (log in again with it).
type registeredDevice struct {
	authapi.MFADevice
	Relogin bool `json:"relogin,omitempty"`
}

// mfaDevices serves GET /webapi/mfa/devices.
func (s *Server) mfaDevices(w http.ResponseWriter, r *http.Request, live *liveSession) {
	m, ok := s.mfaAuth(w)
	if !ok {
		return
	}
	devs, err := m.ListMFADevices(r.Context(), sessionRequest(live))
	if err != nil {
		writeMFAError(w, s.cfg.Logger.WithField("user", live.user), err)
		return
	}
	if devs == nil {
		devs = []authapi.MFADevice{}
	}
	writeJSON(w, http.StatusOK, devs)
}

// mfaRenameDevice serves PUT /webapi/mfa/devices/{id}.
func (s *Server) mfaRenameDevice(w http.ResponseWriter, r *http.Request, live *liveSession) {
	m, ok := s.mfaAuth(w)
	if !ok {
		return
	}
	var body mfaRenameBody
	if !readMFABody(w, r, &body) {
		return
	}
	err := m.RenameMFADevice(r.Context(), authapi.MFADeviceRequest{WebSessionRequest: sessionRequest(live), ID: r.PathValue("id"), NewName: body.Name})
	if err != nil {
		writeMFAError(w, s.cfg.Logger.WithField("user", live.user), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// mfaDeleteDevice serves DELETE /webapi/mfa/devices/{id}.
func (s *Server) mfaDeleteDevice(w http.ResponseWriter, r *http.Request, live *liveSession) {
	m, ok := s.mfaAuth(w)
	if !ok {
		return
	}
	err := m.DeleteMFADevice(r.Context(), authapi.MFADeviceRequest{WebSessionRequest: sessionRequest(live), ID: r.PathValue("id")})
	if err != nil {
		writeMFAError(w, s.cfg.Logger.WithField("user", live.user), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
