package web

import (
	"context"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/api/webapi"
)

// SecondFactorSource asks auth for the cluster's second-factor hint
// (*auth.Client does; auth computes it, since only auth sees the users'
// secrets).
type SecondFactorSource interface {
	ClusterSecondFactor(ctx context.Context) (string, error)
}

// secondFactorTTL is how long the answer is reused: /webapi/ping is
// unauthenticated, so it must not cost a scan of every user each time; a
// user enrolled in OTP a few seconds ago is at worst asked with --otp.
const secondFactorTTL = 10 * time.Second

// secondFactorLookupTimeout bounds the call to auth behind /webapi/ping. A
// backend that stops answering (etcd down) would otherwise hold every
// ping, and with it `psh login`, until the client gives up, so the user
// would never hear the login's own "auth server unavailable". The answer
// takes milliseconds; real time, as it bounds I/O.
const secondFactorLookupTimeout = 2 * time.Second

// CachedSecondFactor returns a Config.SecondFactor that asks src at most
// once per secondFactorTTL.
func CachedSecondFactor(src SecondFactorSource, clock clockwork.Clock) func(context.Context) string {
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
		sf, err := src.ClusterSecondFactor(ctx)
		if err != nil {
			// Fail towards asking: a prompt the user can leave empty is
			// better than a login that cannot succeed. Remembered like
			// an answer, so that pings during an outage do not each wait
			// for the bound.
			value, expires = webapi.SecondFactorOTP, now.Add(secondFactorTTL)
			return value
		}
		value = sf
		expires = now.Add(secondFactorTTL)
		return value
	}
}
