package authapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// Error kinds on the wire. The client turns each back into the matching
// trace error, so `trace.IsNotFound(err)` means the same thing whether the
// caller holds a Store or a Client.
const (
	KindNotFound          = "not_found"
	KindAccessDenied      = "access_denied"
	KindBadParameter      = "bad_parameter"
	KindAlreadyExists     = "already_exists"
	KindLimitExceeded     = "limit_exceeded"
	KindConnectionProblem = "connection_problem"
	KindCompareFailed     = "compare_failed"
	// KindLocked is an access denial because of a lock (services.LockDenied):
	// the client gets an error for which both trace.IsAccessDenied and
	// services.IsLocked hold.
	KindLocked   = "locked"
	KindInternal = "internal"
)

// ErrorResponse is the body of every error response:
// {"error":{"kind":"not_found","message":"..."}}.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is ErrorResponse's one field.
type ErrorBody struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// RetryAfterSeconds, on a limit_exceeded error, is when the caller may
	// try again (a RetryAfterError); absent when the refusal names no wait.
	RetryAfterSeconds int64 `json:"retry_after_seconds,omitempty"`
}

// NewErrorBody is the wire form of err.
func NewErrorBody(err error) ErrorBody {
	kind, _ := ErrorKind(err)
	return ErrorBody{Kind: kind, Message: trace.UserMessage(err), RetryAfterSeconds: retryAfterSeconds(err)}
}

// ErrorKind classifies err and picks the HTTP status that goes with it.
func ErrorKind(err error) (string, int) {
	switch {
	case services.IsLocked(err):
		return KindLocked, http.StatusForbidden
	case trace.IsNotFound(err):
		return KindNotFound, http.StatusNotFound
	case trace.IsAccessDenied(err):
		return KindAccessDenied, http.StatusForbidden
	case trace.IsBadParameter(err):
		return KindBadParameter, http.StatusBadRequest
	case trace.IsAlreadyExists(err):
		return KindAlreadyExists, http.StatusConflict
	case trace.IsLimitExceeded(err):
		return KindLimitExceeded, http.StatusTooManyRequests
	case trace.IsConnectionProblem(err):
		// 503: the auth server is up but cannot serve (its backend is
		// down, or it is shutting down); clients retry later.
		return KindConnectionProblem, http.StatusServiceUnavailable
	case trace.IsCompareFailed(err):
		return KindCompareFailed, http.StatusPreconditionFailed
	}
	return KindInternal, http.StatusInternalServerError
}

// ErrorFromKind rebuilds a trace error from the wire.
func ErrorFromKind(kind, message string) error {
	switch kind {
	case KindNotFound:
		return trace.NotFound("%s", message)
	case KindAccessDenied:
		return trace.AccessDenied("%s", message)
	case KindLocked:
		return trace.Wrap(services.LockDenied(message))
	case KindBadParameter:
		return trace.BadParameter("%s", message)
	case KindAlreadyExists:
		return trace.AlreadyExists("%s", message)
	case KindLimitExceeded:
		return trace.LimitExceeded("%s", message)
	case KindConnectionProblem:
		return trace.ConnectionProblem(nil, "%s", message)
	case KindCompareFailed:
		return trace.CompareFailed("%s", message)
	}
	return trace.Wrap(errors.New(message))
}

// MaxErrorBody bounds how much of an error response a client reads.
const MaxErrorBody = 64 << 10

// ReadErrorResponse turns a non-2xx response into a trace error. A body
// that is not our JSON (a proxy in the way, say) still yields an error
// that names the status.
func ReadErrorResponse(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
	var we ErrorResponse
	if err := json.Unmarshal(data, &we); err == nil && we.Error.Kind != "" {
		if we.Error.Kind == KindLimitExceeded && we.Error.RetryAfterSeconds > 0 {
			return RetryAfter(time.Duration(we.Error.RetryAfterSeconds)*time.Second, we.Error.Message)
		}
		return ErrorFromKind(we.Error.Kind, we.Error.Message)
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
