package web

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// Access requests in the web UI: a reviewer lists, shows, approves and
// denies; a requester sees their own. Every call passes the session's
// certificate to the auth server, which acts for the user it names (the
// proxy's word alone does not make anyone a reviewer), exactly as the
// proxy's SSH port does for psh.

// AccessRequestAPI is the auth server's access request API; the auth
// client is one.
type AccessRequestAPI interface {
	ListAccessRequests(ctx context.Context, userCert []byte) ([]services.AccessRequest, error)
	GetAccessRequest(ctx context.Context, userCert []byte, id string) (*services.AccessRequest, error)
	ReviewAccessRequest(ctx context.Context, req authapi.AccessRequestReview) (*services.AccessRequest, error)
	// AccessRequestCert certifies the key of UserCert with an approved
	// request's roles (assuming a request, requestassume.go).
	AccessRequestCert(ctx context.Context, req authapi.AccessRequestCert) ([]byte, error)
}

// maxReviewBody bounds a review's body: a verdict and one line of reason.
const maxReviewBody = 8 << 10

// ReviewRequestBody is POST /webapi/requests/{id}/review.
type ReviewRequestBody struct {
	// State is "approved" or "denied".
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// The Requests page (web/src/requests.js) is an app route.
func init() {
	appRoutes = append(appRoutes, regexp.MustCompile(`^/web/requests(/[0-9a-f-]{36})?$`))
}

func (s *Server) registerRequestRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /webapi/requests", s.requireSession(s.listAccessRequests))
	mux.HandleFunc("GET /webapi/requests/{id}", s.requireSession(s.getAccessRequest))
	mux.HandleFunc("POST /webapi/requests/{id}/review", s.requireSession(s.reviewAccessRequest))
	s.registerAssumeRoutes(mux)
}

// requestAPI answers 501 when this proxy has no access request API.
func (s *Server) requestAPI(w http.ResponseWriter) AccessRequestAPI {
	api := s.cfg.WebSessions.AccessRequests
	if api == nil {
		writeError(w, http.StatusNotImplemented, "this proxy does not serve access requests")
	}
	return api
}

// writeRequestError maps the auth server's answer to HTTP: what the user
// may fix (400), may not do (403), may not see (404); anything else is
// an internal error whose cause stays in the proxy's log.
func (s *Server) writeRequestError(w http.ResponseWriter, live *liveSession, err error) {
	switch {
	case trace.IsNotFound(err):
		writeError(w, http.StatusNotFound, trace.UserMessage(err))
	case trace.IsAccessDenied(err):
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
	case trace.IsBadParameter(err):
		writeError(w, http.StatusBadRequest, trace.UserMessage(err))
	case trace.IsConnectionProblem(err):
		writeError(w, http.StatusServiceUnavailable, "the auth server cannot be reached; try again")
	default:
		internalError(w, s.cfg.Logger.WithField("user", live.user), "Access request call failed.", err)
	}
}

func (s *Server) listAccessRequests(w http.ResponseWriter, r *http.Request, live *liveSession) {
	api := s.requestAPI(w)
	if api == nil {
		return
	}
	list, err := api.ListAccessRequests(r.Context(), ssh.MarshalAuthorizedKey(live.cert))
	if err != nil {
		s.writeRequestError(w, live, err)
		return
	}
	if list == nil {
		list = []services.AccessRequest{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) getAccessRequest(w http.ResponseWriter, r *http.Request, live *liveSession) {
	api := s.requestAPI(w)
	if api == nil {
		return
	}
	req, err := api.GetAccessRequest(r.Context(), ssh.MarshalAuthorizedKey(live.cert), r.PathValue("id"))
	if err != nil {
		s.writeRequestError(w, live, err)
		return
	}
	writeJSON(w, http.StatusOK, req)
}

func (s *Server) reviewAccessRequest(w http.ResponseWriter, r *http.Request, live *liveSession) {
	api := s.requestAPI(w)
	if api == nil {
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReviewBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "could not read the review (at most 8 KiB)")
		return
	}
	var body ReviewRequestBody
	if err := json.Unmarshal(data, &body); err != nil {
		writeError(w, http.StatusBadRequest, "invalid review: want {\"state\": \"approved\"|\"denied\", \"reason\": \"...\"}")
		return
	}
	req, err := api.ReviewAccessRequest(r.Context(), authapi.AccessRequestReview{
		UserCert: ssh.MarshalAuthorizedKey(live.cert), ID: r.PathValue("id"), State: body.State, Reason: body.Reason,
	})
	if err != nil {
		s.writeRequestError(w, live, err)
		return
	}
	writeJSON(w, http.StatusOK, req)
}
