package web

import (
	"context"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/services"
)

// UserLister lists users with their TOTP secrets: *services.Store does.
// (The auth API strips secrets, so a proxy whose auth runs elsewhere has
// no cheap way to know and reports "off"; psh then asks for an OTP only
// with --otp.)
type UserLister interface {
	GetUsers(ctx context.Context) ([]services.User, error)
}

var _ UserLister = (*services.Store)(nil)

// secondFactorTTL is how long the answer is reused: /webapi/ping is
// unauthenticated, so it must not cost a scan of every user each time; a
// user enrolled in OTP a few seconds ago is at worst asked with --otp.
const secondFactorTTL = 10 * time.Second

// secondFactorLookupTimeout bounds the user scan behind /webapi/ping. A
// backend that stops answering (etcd down) would otherwise hold every
// ping, and with it `psh login`, until the client gives up, so the user
// would never hear the login's own "auth server unavailable". A scan of
// the users takes milliseconds; real time, as it bounds I/O.
const secondFactorLookupTimeout = 2 * time.Second

// OTPEnrolled returns a Config.SecondFactor that reports "otp" when any
// user of the cluster has a TOTP secret. The cluster-wide flag cannot say
// which users have OTP (that would tell an anonymous caller who does), so
// psh prompts for a code and users without OTP leave it empty: auth
// ignores the code for them.
func OTPEnrolled(users UserLister, clock clockwork.Clock) func(context.Context) string {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	var (
		// mu guards value and expires.
		mu      sync.Mutex
		value   string
		expires time.Time
	)
	return func(ctx context.Context) string {
		mu.Lock()
		defer mu.Unlock()
		now := clock.Now()
		if value != "" && now.Before(expires) {
			return value
		}
		ctx, cancel := context.WithTimeout(ctx, secondFactorLookupTimeout)
		defer cancel()
		list, err := users.GetUsers(ctx)
		if err != nil {
			// Fail towards asking: a prompt the user can leave empty is
			// better than a login that cannot succeed. Remembered like
			// an answer, so that pings during an outage do not each wait
			// for the bound.
			value, expires = webapi.SecondFactorOTP, now.Add(secondFactorTTL)
			return value
		}
		value = webapi.SecondFactorOff
		for _, u := range list {
			if u.TOTPSecret != "" {
				value = webapi.SecondFactorOTP
				break
			}
		}
		expires = now.Add(secondFactorTTL)
		return value
	}
}
