package services

import (
	"context"
	"strconv"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// otpUsedPrefix holds one item per TOTP code accepted, keyed by user and
// time step: /otp_used/USER/STEP.
const otpUsedPrefix = "otp_used"

func otpUsedKey(user string, step int64) string {
	return backend.Key(otpUsedPrefix, user, strconv.FormatInt(step, 10))
}

// MarkOTPUsed records that user's TOTP code for time step step has been
// accepted, until expires (when the code is no longer valid anyway and the
// backend drops the item). It fails with AlreadyExists if that code was
// recorded before. The record is a backend Create, which succeeds for
// exactly one caller per key, so among auth servers sharing the backend
// exactly one can accept a given code (RFC 6238 section 5.2).
func (s *Store) MarkOTPUsed(ctx context.Context, user string, step int64, expires time.Time) error {
	if err := checkKeyComponent("user", user); err != nil {
		return trace.Wrap(err)
	}
	if expires.IsZero() {
		return trace.BadParameter("a used OTP record needs an expiry")
	}
	_, err := s.b.Create(ctx, backend.Item{Key: otpUsedKey(user, step), Value: []byte("{}"), Expires: expires})
	if trace.IsAlreadyExists(err) {
		return trace.AlreadyExists("one-time password of user %q for time step %d was already used", user, step)
	}
	return trace.Wrap(err)
}
