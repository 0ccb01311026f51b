package authapi

import (
	"errors"
	"math"
	"time"

	"github.com/gravitational/trace"
)

// RetryAfterError is a refusal that says when to try again: a login
// lockout. The wait is data, not text, so that whoever answers the user
// (the proxy's Retry-After header, psh's message) reads it without parsing
// a message, and the message can be reworded freely. It unwraps to a
// trace.LimitExceededError: trace.IsLimitExceeded holds for it, in this
// process and, rebuilt by ReadErrorResponse, across the wire.
type RetryAfterError struct {
	// Wait is how long the caller should wait; positive.
	Wait time.Duration
	err  *trace.LimitExceededError
}

// RetryAfter is a LimitExceeded error that names its wait. A wait of zero
// or less becomes one second: a refusal never says "try again now".
func RetryAfter(wait time.Duration, message string) error {
	if wait <= 0 {
		wait = time.Second
	}
	return trace.Wrap(&RetryAfterError{Wait: wait, err: &trace.LimitExceededError{Message: message}})
}

// Error is the message.
func (e *RetryAfterError) Error() string { return e.err.Error() }

// Unwrap is the LimitExceeded error under it.
func (e *RetryAfterError) Unwrap() error { return e.err }

// RetryAfterOf is the wait err names, if it is (or wraps) a
// RetryAfterError.
func RetryAfterOf(err error) (time.Duration, bool) {
	var r *RetryAfterError
	if errors.As(err, &r) {
		return r.Wait, true
	}
	return 0, false
}

// retryAfterSeconds is the wait on the wire: whole seconds, rounded up so
// that a client that waits exactly that long is not refused again.
func retryAfterSeconds(err error) int64 {
	wait, ok := RetryAfterOf(err)
	if !ok {
		return 0
	}
	return int64(math.Ceil(wait.Seconds()))
}
