package authapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
)

// roundTrip sends err the way the auth API server answers (ErrorKind's
// status, NewErrorBody) and reads it back the way the client does.
func roundTrip(t *testing.T, err error) (ErrorBody, error) {
	t.Helper()
	rec := httptest.NewRecorder()
	_, status := ErrorKind(err)
	rec.WriteHeader(status)
	body := NewErrorBody(err)
	require.NoError(t, json.NewEncoder(rec.Body).Encode(ErrorResponse{Error: body}))
	return body, ReadErrorResponse(rec.Result())
}

func TestRetryAfterCrossesTheWire(t *testing.T) {
	err := RetryAfter(1500*time.Millisecond, "too many failed login attempts")
	require.True(t, trace.IsLimitExceeded(err), "a RetryAfter error is LimitExceeded")
	wait, ok := RetryAfterOf(trace.Wrap(err))
	require.True(t, ok)
	require.Equal(t, 1500*time.Millisecond, wait)

	body, got := roundTrip(t, err)
	require.Equal(t, KindLimitExceeded, body.Kind)
	require.Equal(t, int64(2), body.RetryAfterSeconds, "rounded up: waiting that long is enough")
	require.True(t, trace.IsLimitExceeded(got))
	require.Equal(t, "too many failed login attempts", trace.UserMessage(got))
	wait, ok = RetryAfterOf(got)
	require.True(t, ok)
	require.Equal(t, 2*time.Second, wait)

	// A refusal without a wait carries none, and reads back without one.
	body, got = roundTrip(t, trace.LimitExceeded("slow down"))
	require.Zero(t, body.RetryAfterSeconds)
	require.True(t, trace.IsLimitExceeded(got))
	_, ok = RetryAfterOf(got)
	require.False(t, ok)

	// The field means nothing on another kind.
	rec := httptest.NewRecorder()
	rec.WriteHeader(http.StatusForbidden)
	require.NoError(t, json.NewEncoder(rec.Body).Encode(ErrorResponse{Error: ErrorBody{Kind: KindAccessDenied, Message: "no", RetryAfterSeconds: 9}}))
	got = ReadErrorResponse(rec.Result())
	require.True(t, trace.IsAccessDenied(got))
	_, ok = RetryAfterOf(got)
	require.False(t, ok)

	// Never "try again now".
	wait, _ = RetryAfterOf(RetryAfter(0, "x"))
	require.Equal(t, time.Second, wait)
}
