package auth

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// TestErrorKindsRoundTrip: every trace kind survives the wire encoding.
func TestErrorKindsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err error
		is  func(error) bool
	}{
		{trace.NotFound("nf"), trace.IsNotFound},
		{trace.AccessDenied("ad"), trace.IsAccessDenied},
		{trace.BadParameter("bp"), trace.IsBadParameter},
		{trace.AlreadyExists("ae"), trace.IsAlreadyExists},
		{trace.LimitExceeded("le"), trace.IsLimitExceeded},
		{trace.ConnectionProblem(nil, "cp"), trace.IsConnectionProblem},
		{trace.CompareFailed("cf"), trace.IsCompareFailed},
	} {
		rec := httptest.NewRecorder()
		writeError(rec, trace.Wrap(tc.err))
		got := authapi.ReadErrorResponse(rec.Result())
		require.True(t, tc.is(got), "%v -> %v", tc.err, got)
		require.Equal(t, tc.err.Error(), got.Error())
	}
	rec := httptest.NewRecorder()
	writeError(rec, trace.Errorf("boom"))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Contains(t, authapi.ReadErrorResponse(rec.Result()).Error(), "boom")
}

func TestServerSANs(t *testing.T) {
	dns, ips := serverSANs(&net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 3025}, []string{"auth.example.com:3025", "203.0.113.9", "[2001:db8::1]:3025"})
	require.Subset(t, dns, []string{AuthServerName, JoinServerName, "localhost", "auth.example.com"})
	var got []string
	for _, ip := range ips {
		got = append(got, ip.String())
	}
	require.Subset(t, got, []string{"127.0.0.1", "::1", "192.0.2.10", "203.0.113.9", "2001:db8::1"})

	// Listening on every interface covers loopback at least once.
	_, ips = serverSANs(&net.TCPAddr{IP: net.IPv4zero, Port: 3025}, nil)
	n := 0
	for _, ip := range ips {
		if ip.Equal(net.IPv4(127, 0, 0, 1)) {
			n++
		}
	}
	require.Equal(t, 1, n)
}

func TestLimiterSweep(t *testing.T) {
	clock := clockwork.NewFakeClock()
	l := newLoginLimiter(LoginLimits{MaxFailures: 2, Window: time.Minute}, clock)
	l.failure("a", "10.0.0.1:1")
	l.failure("b", "")
	// Per address, per (user, address) and per user.
	require.Len(t, l.entries, 6)
	clock.Advance(time.Minute)
	l.mu.Lock()
	l.sweepLocked(clock.Now())
	l.mu.Unlock()
	require.Empty(t, l.entries)
	// Long user names are truncated in the limiter's keys.
	long := string(make([]byte, 10_000))
	l.failure(long, "")
	for k := range l.entries {
		require.LessOrEqual(t, len(k), 2*maxLimiterKeyLen+len("user:"))
	}
}

func TestCertAuthoritiesAndKnownHosts(t *testing.T) {
	env := newTestAPI(t)
	node := env.client(t, env.identity(t, "n", RoleNode))
	cas, err := node.GetCertAuthorities(context.Background(), services.HostCA, false)
	require.NoError(t, err)
	require.Len(t, cas, 1)
	require.Empty(t, cas[0].SSHPrivateKeys)
	require.Empty(t, cas[0].TLSKey)
	require.Equal(t, env.auth.HostCAKeys(), cas[0].SSHPublicKeys)
	_, err = node.GetCertAuthorities(context.Background(), services.HostCA, true)
	require.True(t, trace.IsBadParameter(err))
	lines := authapi.KnownHostsLines(cas[0].SSHPublicKeys)
	require.Equal(t, []string{"@cert-authority * " + cas[0].SSHPublicKeys[0]}, lines)
}
