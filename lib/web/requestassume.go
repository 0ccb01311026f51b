package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// Assuming an access request in the browser, as `psh login --request-id`
// does in a terminal: the session's key is certified again by the auth
// server, with the user's roles plus the approved request's and the
// request id, expiring with the request. The auth server decides (only the
// user's own approved request, for the key of the certificate that asks);
// this proxy only swaps which certificate the session serves with.
//
// The assumed session is a second live half of the same web session,
// registered in its place: handlers that already hold the session's own
// half finish with it, and nothing another goroutine reads is mutated. It
// has a context of its own under the session's, so that dropping the
// request, or its end (a lock on its id: denied, expired), ends exactly
// the terminals opened with the grant and the session goes on with its own
// roles; logging out still ends everything. The assumption lives on the
// proxy that made it: a session served by another proxy has its own
// roles there.

// assumption links an assumed session to the session's own half.
type assumption struct {
	// base is the session's own half, served again when the grant ends.
	base *liveSession
	// end ends the terminals opened with the grant, not the session.
	end context.CancelCauseFunc
}

// Causes that end the terminals opened with an assumed request.
var (
	errRequestDropped  = errors.New("the access request was dropped: terminals opened with its roles were closed")
	errRequestReplaced = errors.New("another access request was assumed: terminals opened with the previous one were closed")
)

// AssumedRequest is GET /webapi/requests/assumed and the answer to an
// assume: the request the session serves with, empty when none.
type AssumedRequest struct {
	RequestID string    `json:"request_id,omitempty"`
	Roles     []string  `json:"roles,omitempty"`
	Expires   time.Time `json:"expires,omitzero"`
}

func (s *Server) registerAssumeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /webapi/requests/assumed", s.requireSession(s.getAssumedRequest))
	mux.HandleFunc("DELETE /webapi/requests/assumed", s.requireSession(s.dropAssumedRequest))
	mux.HandleFunc("POST /webapi/requests/{id}/assume", s.requireSession(s.assumeRequest))
}

// assumedOf describes what live serves with.
func assumedOf(live *liveSession) AssumedRequest {
	if live.assumed == nil || live.cert == nil {
		return AssumedRequest{}
	}
	return AssumedRequest{
		RequestID: live.cert.Permissions.Extensions[services.CertExtensionRequestID],
		Roles:     live.assumed.roles(live),
		Expires:   time.Unix(int64(live.cert.ValidBefore), 0).UTC(),
	}
}

// roles are the roles the grant adds to the session's own.
func (a *assumption) roles(live *liveSession) []string {
	own := map[string]bool{}
	for _, r := range certRoles(a.base.cert) {
		own[r] = true
	}
	var out []string
	for _, r := range certRoles(live.cert) {
		if !own[r] {
			out = append(out, r)
		}
	}
	return out
}

func (s *Server) getAssumedRequest(w http.ResponseWriter, _ *http.Request, live *liveSession) {
	writeJSON(w, http.StatusOK, assumedOf(live))
}

// assumeRequest serves POST /webapi/requests/{id}/assume.
func (s *Server) assumeRequest(w http.ResponseWriter, r *http.Request, live *liveSession) {
	api := s.requestAPI(w)
	if api == nil {
		return
	}
	base := live
	if live.assumed != nil {
		base = live.assumed.base
	}
	// The session's own certificate asks, for its own key: auth issues
	// nothing for a key the session does not hold.
	certBytes, err := api.AccessRequestCert(r.Context(), authapi.AccessRequestCert{
		UserCert: ssh.MarshalAuthorizedKey(base.cert), ID: r.PathValue("id"), PublicKey: ssh.MarshalAuthorizedKey(base.cert.Key),
	})
	if err != nil {
		s.writeRequestError(w, live, err)
		return
	}
	assumed, err := newAssumedSession(base, certBytes)
	if err != nil {
		internalError(w, s.cfg.Logger.WithField("user", live.user), "Assume: unusable certificate from auth.", err)
		return
	}
	if !s.web.sessions.swap(live, assumed) {
		assumed.assumed.end(errLoggedOut)
		writeError(w, http.StatusConflict, "the session changed meanwhile (another tab assumed or dropped a request); reload and try again")
		return
	}
	if live.assumed != nil {
		live.assumed.end(errRequestReplaced)
	}
	// A deny or an expiry may have landed between auth's answer and the
	// swap, after the lock enforcer looked at this session: look again.
	if got, err := s.checkLocks(assumed); err != nil || got != assumed {
		if err == nil {
			err = trace.AccessDenied("the access request's grant has ended")
		}
		if services.IsLocked(err) {
			s.endSessionCause(r.Context(), live.ref, err)
		}
		writeError(w, http.StatusForbidden, lockRefusal(err))
		return
	}
	out := assumedOf(assumed)
	s.cfg.Logger.WithField("user", live.user).WithField("request", out.RequestID).Info("Web session assumed an access request.")
	writeJSON(w, http.StatusOK, out)
}

// dropAssumedRequest serves DELETE /webapi/requests/assumed: back to the
// session's own roles.
func (s *Server) dropAssumedRequest(w http.ResponseWriter, _ *http.Request, live *liveSession) {
	if live.assumed == nil {
		writeJSON(w, http.StatusOK, AssumedRequest{})
		return
	}
	s.dropAssumed(live, errRequestDropped)
	s.cfg.Logger.WithField("user", live.user).Info("Web session dropped its access request.")
	writeJSON(w, http.StatusOK, AssumedRequest{})
}

// dropAssumed puts live's own half back in its place and ends the
// terminals opened with the grant (cause says why); it returns the
// session to serve.
func (s *Server) dropAssumed(live *liveSession, cause error) *liveSession {
	base := live.assumed.base
	if s.web.sessions.swap(live, base) {
		s.cfg.Logger.WithField("user", live.user).WithField("reason", cause.Error()).Info("Web session back to its own roles.")
	}
	live.assumed.end(cause)
	if got := s.web.sessions.get(live.key); got != nil {
		return got
	}
	return base
}

// newAssumedSession is base serving with certBytes (a certificate of
// base's key), under a context of its own.
func newAssumedSession(base *liveSession, certBytes []byte) (*liveSession, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, trace.BadParameter("auth returned a plain key, not a certificate")
	}
	signer, err := ssh.NewCertSigner(cert, base.keySigner)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	a := &liveSession{
		key: base.key, ref: base.ref, endID: base.endID, user: base.user,
		signer: signer, keySigner: base.keySigner, cert: cert, hostCAs: base.hostCAs, expires: base.expires,
	}
	ctx, end := context.WithCancelCause(base.ctx)
	a.ctx = ctx
	// Ending the session (logout, lock, expiry) ends both halves' terminals.
	a.cancel = func(cause error) {
		end(cause)
		base.cancel(cause)
	}
	a.assumed = &assumption{base: base, end: end}
	return a, nil
}

// swap registers next in old's place, if old is still the registered
// half of its session.
func (r *sessionRegistry) swap(old, next *liveSession) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey[old.key] != old {
		return false
	}
	r.byKey[old.key] = next
	return true
}

// certRoles are the roles a session certificate names.
func certRoles(cert *ssh.Certificate) []string {
	if cert == nil {
		return nil
	}
	var roles []string
	if err := json.Unmarshal([]byte(cert.Permissions.Extensions[services.CertExtensionRoles]), &roles); err != nil {
		return nil
	}
	return roles
}
