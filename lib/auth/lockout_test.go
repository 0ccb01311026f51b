package auth

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/pquerna/otp/totp"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/observe"
)

func login(env *testEnv, user, password, addr string) error {
	_, err := env.auth.AuthenticateUser(context.Background(), authapi.AuthRequest{User: user, Password: password, RemoteAddr: addr})
	return err
}

// TestLockoutCannotLockOutTheRealUser is issue 10 item 6: an attacker who
// fails alice's password over and over from one address locks that
// address (and alice at that address) out, never alice herself.
func TestLockoutCannotLockOutTheRealUser(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	for _, u := range []string{"alice", "bob"} {
		_, err := env.auth.CreateUser(ctx, u, []byte(u+"-pw"), []string{u}, nil, false)
		require.NoError(t, err)
	}
	const attacker, alicesAddr = "203.0.113.66:4000", "198.51.100.7:5000"

	for i := range 50 {
		err := login(env, "alice", fmt.Sprintf("guess-%d", i), attacker)
		if i < DefaultMaxLoginFailures {
			requireKind(t, err, trace.IsAccessDenied, "invalid credentials")
		} else {
			requireKind(t, err, trace.IsLimitExceeded, "too many failed login attempts")
		}
	}
	// alice, from her own address, gets in with her password.
	require.NoError(t, login(env, "alice", "alice-pw", alicesAddr))
	// (alice, attacker's address) is locked, even for the right password...
	requireKind(t, login(env, "alice", "alice-pw", attacker), trace.IsLimitExceeded, "try again in")
	// ...and the address kept guessing at a locked account: it is locked
	// for every user.
	requireKind(t, login(env, "bob", "bob-pw", "203.0.113.66:4001"), trace.IsLimitExceeded, "try again in")
	require.NoError(t, login(env, "bob", "bob-pw", alicesAddr))

	// Locks last one window, and refused attempts do not prolong them.
	env.clock.Advance(DefaultLoginWindow - time.Second)
	requireKind(t, login(env, "alice", "alice-pw", attacker), trace.IsLimitExceeded, "try again in 1s")
	env.clock.Advance(time.Second)
	require.NoError(t, login(env, "alice", "alice-pw", attacker))
	require.NoError(t, login(env, "bob", "bob-pw", attacker))
}

// TestLockoutPerAddress: one address spraying many users locks itself out
// for everyone; other addresses are not affected. IPv6 counts by /64.
func TestLockoutPerAddress(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "erin", []byte("right-pw"), []string{"erin"}, nil, false)
	require.NoError(t, err)
	for i := range DefaultMaxAddrFailures {
		requireKind(t, login(env, fmt.Sprintf("u%d", i), "bad", "192.0.2.7:4000"), trace.IsAccessDenied, "invalid credentials")
	}
	requireKind(t, login(env, "erin", "right-pw", "192.0.2.7:4001"), trace.IsLimitExceeded, "try again in 10m0s")
	require.NoError(t, login(env, "erin", "right-pw", "192.0.2.8:4001"))

	for i := range DefaultMaxAddrFailures {
		addr := fmt.Sprintf("[2001:db8:1:2::%x]:22", i+1)
		requireKind(t, login(env, fmt.Sprintf("v%d", i), "bad", addr), trace.IsAccessDenied, "invalid credentials")
	}
	requireKind(t, login(env, "erin", "right-pw", "[2001:db8:1:2:ffff::1]:22"), trace.IsLimitExceeded, "try again in")
	require.NoError(t, login(env, "erin", "right-pw", "[2001:db8:1:3::1]:22"))
}

// TestLockoutThrottlesDistributedGuessing: an attacker spread over many
// addresses gets one guess per address per window once the user's budget
// is spent, instead of five; the right password from a clean address
// still gets in, and an admin can clear the user's locks.
func TestLockoutThrottlesDistributedGuessing(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "carol", []byte("carol-pw"), []string{"carol"}, nil, false)
	require.NoError(t, err)

	const addrs, rounds = 100, 5
	checked := 0 // guesses that reached the password check
	for range rounds {
		for i := range addrs {
			err := login(env, "carol", "guess", fmt.Sprintf("10.7.%d.%d:1", i/250, i%250+1))
			switch {
			case trace.IsAccessDenied(err):
				checked++
			case trace.IsLimitExceeded(err):
			default:
				t.Fatalf("unexpected answer: %v", err)
			}
		}
	}
	t.Logf("%d of %d guesses reached the password check", checked, addrs*rounds)
	require.LessOrEqual(t, checked, addrs+DefaultMaxUserFailures)

	// A dirty address is refused for carol even with her password; a
	// clean one is not.
	requireKind(t, login(env, "carol", "carol-pw", "10.7.0.1:2"), trace.IsLimitExceeded, "try again in")
	require.NoError(t, login(env, "carol", "carol-pw", "198.51.100.9:1"))

	// The admin's way out: pctl users clear-lockout (over the API, admin only).
	admin := env.adminClient(t)
	cleared, err := admin.ClearLockout(ctx, "carol", "")
	require.NoError(t, err)
	require.True(t, cleared)
	require.NoError(t, login(env, "carol", "carol-pw", "10.7.0.1:2"))
	cleared, err = admin.ClearLockout(ctx, "carol", "")
	require.NoError(t, err)
	require.False(t, cleared)
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))
	_, err = proxy.ClearLockout(ctx, "carol", "")
	requireKind(t, err, trace.IsAccessDenied, "may not call")
	_, err = admin.ClearLockout(ctx, "", "")
	require.Error(t, err)

	// --addr clears an address locked for everyone.
	for i := range DefaultMaxAddrFailures {
		require.Error(t, login(env, fmt.Sprintf("w%d", i), "bad", "192.0.2.99:1"))
	}
	requireKind(t, login(env, "carol", "carol-pw", "192.0.2.99:2"), trace.IsLimitExceeded, "try again in")
	cleared, err = admin.ClearLockout(ctx, "carol", "192.0.2.99")
	require.NoError(t, err)
	require.True(t, cleared)
	require.NoError(t, login(env, "carol", "carol-pw", "192.0.2.99:2"))
}

// totpUser creates a user with a TOTP secret and returns the secret.
func totpUser(t *testing.T, env *testEnv, name string) string {
	t.Helper()
	otpURL, err := env.auth.CreateUser(context.Background(), name, []byte("pw"), []string{name}, nil, true)
	require.NoError(t, err)
	u, err := url.Parse(otpURL)
	require.NoError(t, err)
	return u.Query().Get("secret")
}

func codeAt(t *testing.T, secret string, at time.Time) string {
	t.Helper()
	code, err := totp.GenerateCodeCustom(secret, at, totpOpts)
	require.NoError(t, err)
	return code
}

func otpLogin(s *Server, user, code string) error {
	_, err := s.AuthenticateUser(context.Background(), authapi.AuthRequest{User: user, Password: "pw", OTP: code, RemoteAddr: "192.0.2.1"})
	return err
}

// TestTOTPReplayOfAnOlderCode is issue 10 item 7: a code is accepted once
// in its whole validity window, even after a newer code was used.
func TestTOTPReplayOfAnOlderCode(t *testing.T) {
	env := newTestAuth(t)
	secret := totpUser(t, env, "frank")
	period := time.Duration(totpOpts.Period) * time.Second
	// Start at the beginning of a time step N.
	now := env.clock.Now()
	env.clock.Advance(now.Truncate(period).Add(period).Sub(now))

	codeN := codeAt(t, secret, env.clock.Now())
	require.NoError(t, otpLogin(env.auth, "frank", codeN))
	env.clock.Advance(period) // step N+1: code N is still within the skew
	codeN1 := codeAt(t, secret, env.clock.Now())
	require.NotEqual(t, codeN, codeN1)
	require.NoError(t, otpLogin(env.auth, "frank", codeN1))
	requireKind(t, otpLogin(env.auth, "frank", codeN), trace.IsAccessDenied, "invalid credentials")
	requireKind(t, otpLogin(env.auth, "frank", codeN1), trace.IsAccessDenied, "invalid credentials")
	// A code from the future end of the skew is accepted once too.
	codeN2 := codeAt(t, secret, env.clock.Now().Add(period))
	require.NoError(t, otpLogin(env.auth, "frank", codeN2))
	env.clock.Advance(period)
	requireKind(t, otpLogin(env.auth, "frank", codeN2), trace.IsAccessDenied, "invalid credentials")

	// The records are in the backend, with a TTL past the validity window.
	items, err := env.store.Backend().GetRange(context.Background(), backend.Prefix("otp_used", "frank"), 0)
	require.NoError(t, err)
	require.Len(t, items, 3)
	for _, it := range items {
		require.False(t, it.Expires.IsZero())
	}
	env.clock.Advance(time.Duration(2*totpOpts.Skew+3) * period)
	items, err = env.store.Backend().GetRange(context.Background(), backend.Prefix("otp_used", "frank"), 0)
	require.NoError(t, err)
	require.Empty(t, items)
}

// TestTOTPReplayAcrossAuthServers: two auth servers over one backend; a
// code one of them accepted is refused by the other, both ways.
func TestTOTPReplayAcrossAuthServers(t *testing.T) {
	env := newTestAuth(t)
	secret := totpUser(t, env, "gail")
	second, err := NewServer(ServerConfig{
		Store: env.store, ClusterName: testCluster, BcryptCost: bcrypt.MinCost,
		Deps: observe.Deps{Clock: env.clock, Logger: testLogger()},
	})
	require.NoError(t, err)

	code := codeAt(t, secret, env.clock.Now())
	require.NoError(t, otpLogin(env.auth, "gail", code))
	requireKind(t, otpLogin(second, "gail", code), trace.IsAccessDenied, "invalid credentials")

	env.clock.Advance(time.Duration(totpOpts.Period) * time.Second)
	code = codeAt(t, secret, env.clock.Now())
	require.NoError(t, otpLogin(second, "gail", code))
	requireKind(t, otpLogin(env.auth, "gail", code), trace.IsAccessDenied, "invalid credentials")

	// Both at once: exactly one wins.
	env.clock.Advance(time.Duration(totpOpts.Period) * time.Second)
	code = codeAt(t, secret, env.clock.Now())
	errs := make(chan error, 2)
	for _, s := range []*Server{env.auth, second} {
		go func() { errs <- otpLogin(s, "gail", code) }()
	}
	e1, e2 := <-errs, <-errs
	require.True(t, (e1 == nil) != (e2 == nil), "exactly one server accepts: %v / %v", e1, e2)
}
