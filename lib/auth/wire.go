package auth

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/gravitational/trace"
)

// Error kinds on the wire. The client turns each back into the matching
// trace error, so `trace.IsNotFound(err)` means the same thing whether the
// caller holds a Store or a Client.
const (
	kindNotFound          = "not_found"
	kindAccessDenied      = "access_denied"
	kindBadParameter      = "bad_parameter"
	kindAlreadyExists     = "already_exists"
	kindLimitExceeded     = "limit_exceeded"
	kindConnectionProblem = "connection_problem"
	kindCompareFailed     = "compare_failed"
	kindInternal          = "internal"
)

// wireError is the body of every error response:
// {"error":{"kind":"not_found","message":"..."}}.
type wireError struct {
	Error wireErrorBody `json:"error"`
}

type wireErrorBody struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// errorKind classifies err and picks the HTTP status that goes with it.
func errorKind(err error) (string, int) {
	switch {
	case trace.IsNotFound(err):
		return kindNotFound, http.StatusNotFound
	case trace.IsAccessDenied(err):
		return kindAccessDenied, http.StatusForbidden
	case trace.IsBadParameter(err):
		return kindBadParameter, http.StatusBadRequest
	case trace.IsAlreadyExists(err):
		return kindAlreadyExists, http.StatusConflict
	case trace.IsLimitExceeded(err):
		return kindLimitExceeded, http.StatusTooManyRequests
	case trace.IsConnectionProblem(err):
		// 503: the auth server is up but cannot serve (its backend is
		// down, or it is shutting down); clients retry later.
		return kindConnectionProblem, http.StatusServiceUnavailable
	case trace.IsCompareFailed(err):
		return kindCompareFailed, http.StatusPreconditionFailed
	}
	return kindInternal, http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, err error) {
	kind, status := errorKind(err)
	writeJSON(w, status, wireError{Error: wireErrorBody{Kind: kind, Message: trace.UserMessage(err)}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errorFromKind rebuilds a trace error from the wire.
func errorFromKind(kind, message string) error {
	switch kind {
	case kindNotFound:
		return trace.NotFound("%s", message)
	case kindAccessDenied:
		return trace.AccessDenied("%s", message)
	case kindBadParameter:
		return trace.BadParameter("%s", message)
	case kindAlreadyExists:
		return trace.AlreadyExists("%s", message)
	case kindLimitExceeded:
		return trace.LimitExceeded("%s", message)
	case kindConnectionProblem:
		return trace.ConnectionProblem(nil, "%s", message)
	case kindCompareFailed:
		return trace.CompareFailed("%s", message)
	}
	return trace.Wrap(errors.New(message))
}

// maxErrorBody bounds how much of an error response the client reads.
const maxErrorBody = 64 << 10

// readErrorResponse turns a non-2xx response into a trace error. A body
// that is not our JSON (a proxy in the way, say) still yields an error
// that names the status.
func readErrorResponse(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var we wireError
	if err := json.Unmarshal(data, &we); err == nil && we.Error.Kind != "" {
		return errorFromKind(we.Error.Kind, we.Error.Message)
	}
	msg := http.StatusText(resp.StatusCode)
	switch resp.StatusCode {
	case http.StatusNotFound:
		return trace.NotFound("auth API: %s", msg)
	case http.StatusForbidden, http.StatusUnauthorized:
		return trace.AccessDenied("auth API: %s", msg)
	case http.StatusBadRequest:
		return trace.BadParameter("auth API: %s", msg)
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		// A load balancer in front of auth, or auth itself without its
		// JSON body: either way the server is not there for us.
		return trace.ConnectionProblem(nil, "the auth server is unavailable: %d %s", resp.StatusCode, msg)
	}
	return trace.Errorf("auth API: unexpected response %d %s", resp.StatusCode, msg)
}
