package auth

import (
	"context"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/pquerna/otp/totp"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// newAuditedAPI is newTestAPI with an audit recorder.
func newAuditedAPI(t *testing.T) (*testEnv, *events.Recorder) {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	store := newTestStore(t, clock)
	adminDir := filepath.Join(t.TempDir(), "admin")
	rec := events.NewRecorder()
	srv, err := NewServer(ServerConfig{
		Store: store, ClusterName: testCluster, AdminIdentityDir: adminDir,
		BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Logger: testLogger(), Audit: rec},
	})
	require.NoError(t, err)
	env := &testEnv{clock: clock, store: store, auth: srv, adminDir: adminDir}
	startAPI(t, env)
	return env, rec
}

func waitEvent(t *testing.T, rec *events.Recorder, typ string, match func(events.Event) bool) events.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := rec.Wait(ctx, typ, match)
	require.NoError(t, err, "events so far: %v", rec.Events())
	return e
}

// TestJoinAudited: every join over the wire is in the audit log, with the
// UUID auth certified, the role, the hostname and the remote address; a
// failed one with its reason; never the token.
func TestJoinAudited(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	tok, err := env.auth.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.NoError(t, err)

	id, err := Join(ctx, joinParams(env, tok.Name, RoleNode, "node-1"))
	require.NoError(t, err)
	ok := waitEvent(t, rec, events.HostJoin, nil)
	require.Equal(t, id.ID, ok.Fields[events.FieldServerID], "the certified UUID")
	require.Equal(t, RoleNode, ok.Fields[events.FieldRole])
	require.Equal(t, "node-1", ok.Fields[events.FieldHostname])
	require.Regexp(t, `^127\.0\.0\.1:\d+$`, ok.Fields[events.FieldRemoteAddr])

	// The spent token again, and a wrong role.
	_, err = Join(ctx, joinParams(env, tok.Name, RoleNode, "node-2"))
	require.Error(t, err)
	failed := waitEvent(t, rec, events.HostJoinFailed, func(e events.Event) bool { return e.Fields[events.FieldHostname] == "node-2" })
	require.Contains(t, failed.Fields[events.FieldReason], "not found or already used")
	require.Regexp(t, `^127\.0\.0\.1:\d+$`, failed.Fields[events.FieldRemoteAddr])
	require.Equal(t, RoleNode, failed.Fields[events.FieldRole])
	proxyTok, err := env.auth.CreateToken(ctx, services.TokenTypeProxy, time.Hour)
	require.NoError(t, err)
	_, err = Join(ctx, joinParams(env, proxyTok.Name, RoleNode, "sneaky"))
	require.Error(t, err)
	wrong := waitEvent(t, rec, events.HostJoinFailed, func(e events.Event) bool { return e.Fields[events.FieldHostname] == "sneaky" })
	require.Contains(t, wrong.Fields[events.FieldReason], "cannot be used to join as node")

	// Rate limited: still audited.
	for range maxJoinFailures {
		_, _ = Join(ctx, joinParams(env, "0123456789abcdef0123456789abcdef", RoleNode, "guesser"))
	}
	_, err = Join(ctx, joinParams(env, "0123456789abcdef0123456789abcdef", RoleNode, "limited"))
	require.True(t, trace.IsLimitExceeded(err), "%v", err)
	limited := waitEvent(t, rec, events.HostJoinFailed, func(e events.Event) bool { return e.Fields[events.FieldHostname] == "limited" })
	require.Contains(t, limited.Fields[events.FieldReason], "try again in")

	for _, e := range rec.Events() {
		for _, v := range e.Fields {
			s, _ := v.(string)
			require.NotContains(t, s, tok.Name, "a token is a credential: %v", e)
			require.NotContains(t, s, proxyTok.Name, "a token is a credential: %v", e)
		}
	}
}

// TestAPIViolationsAudited: a node announcing another node, or calling an
// endpoint its role may not, is an api.denied event naming the node.
func TestAPIViolationsAudited(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	hn := env.newHostNode(t, "node-a", RoleNode)
	node := env.client(t, hn.id)

	err := node.UpsertNode(ctx, services.Node{UUID: "node-b", Hostname: "b", Addr: hn.addr, Expires: env.clock.Now().Add(time.Minute)})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	e := waitEvent(t, rec, events.APIDenied, func(e events.Event) bool { return e.Fields[events.FieldEndpoint] == "PUT /v1/nodes" })
	require.Equal(t, "node-a", e.Fields[events.FieldServerID])
	require.Equal(t, RoleNode, e.Fields[events.FieldRole])
	require.Contains(t, e.Fields[events.FieldReason], `may not announce node "node-b"`)

	_, err = node.GenerateUserCert(ctx, authapi.UserCertRequest{User: "x"})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	e = waitEvent(t, rec, events.APIDenied, func(e events.Event) bool { return e.Fields[events.FieldEndpoint] == "POST /v1/certs/user" })
	require.Equal(t, "node-a", e.Fields[events.FieldServerID])

	// Its own heartbeat is no violation.
	n := len(rec.Events())
	require.NoError(t, node.UpsertNode(ctx, services.Node{UUID: "node-a", Hostname: "a", Addr: hn.addr, Expires: env.clock.Now().Add(time.Minute)}))
	require.Len(t, rec.Events(), n)
}

// TestHeartbeatRefusalsAudited: a joined node heartbeating under a name
// a join would refuse (NAME.CLUSTER, control characters) or with bad
// labels is an api.denied event naming the node, the endpoint, the name
// it asked for and the reason, like a refused join; a good heartbeat is
// not.
func TestHeartbeatRefusalsAudited(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	hn := env.newHostNode(t, "node-a", RoleNode)
	node := env.client(t, hn.id)
	beat := func(hostname string, labels map[string]string) error {
		return node.UpsertNode(ctx, services.Node{UUID: "node-a", Hostname: hostname, Addr: hn.addr, Labels: labels})
	}
	require.NoError(t, beat("a", nil))
	n := len(rec.Events())
	require.NoError(t, beat("a", nil))
	require.Len(t, rec.Events(), n, "a good heartbeat is no event")

	for _, tc := range []struct {
		hostname string
		labels   map[string]string
		want     string
	}{
		{"db." + testCluster, nil, `ends in .` + testCluster},
		{"web\x1b[2J", nil, `contains the control character U+001B`},
		{"a", map[string]string{"env": "prod\r\nfake=1"}, `contains the control character U+000D`},
	} {
		err := beat(tc.hostname, tc.labels)
		require.True(t, trace.IsBadParameter(err), "%v", err)
		e := waitEvent(t, rec, events.APIDenied, func(e events.Event) bool {
			return e.Fields[events.FieldEndpoint] == "PUT /v1/nodes" && e.Fields[events.FieldHostname] == tc.hostname
		})
		require.Equal(t, "node-a", e.Fields[events.FieldServerID])
		require.Equal(t, RoleNode, e.Fields[events.FieldRole])
		require.Regexp(t, `^127\.0\.0\.1:\d+$`, e.Fields[events.FieldRemoteAddr])
		require.Contains(t, e.Fields[events.FieldReason], tc.want)
	}
}

// TestShipEventsOverTheWire: a node's shipped events are recorded with
// auth's cluster name and the node's own UUID, whatever the node wrote;
// types a host does not produce are refused; only nodes and proxies may
// ship.
func TestShipEventsOverTheWire(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	node := env.client(t, env.identity(t, "node-a", RoleNode))

	require.NoError(t, node.ShipEvents(ctx, []events.Event{
		{Type: events.SessionStart, ID: "s-1", Time: env.clock.Now(), User: "alice", Cluster: "postern",
			Fields: events.Fields{events.FieldServerID: "node-b", events.FieldSessionID: "sid", events.FieldEmitterID: "node-b"}},
		{Type: events.AuthLogin, User: "mallory"},
	}))
	e := waitEvent(t, rec, events.SessionStart, nil)
	require.Equal(t, testCluster, e.Cluster)
	require.Equal(t, "node-a", e.Fields[events.FieldServerID])
	require.Equal(t, "node-a", e.Fields[events.FieldEmitterID])
	require.Equal(t, RoleNode, e.Fields[events.FieldEmitterRole])
	require.Equal(t, "sid", e.Fields[events.FieldSessionID])
	require.Equal(t, "alice", e.User)
	for _, e := range rec.Events() {
		require.NotEqual(t, events.AuthLogin, e.Type, "a host cannot add a login to the record")
	}

	proxy := env.client(t, env.identity(t, "proxy-a", RoleProxy))
	require.NoError(t, proxy.ShipEvents(ctx, []events.Event{{Type: events.RouteAmbiguous, User: "bob"}}))
	e = waitEvent(t, rec, events.RouteAmbiguous, nil)
	require.Equal(t, "proxy-a", e.Fields[events.FieldEmitterID])

	admin := env.adminClient(t)
	err := admin.ShipEvents(ctx, []events.Event{{Type: events.SessionStart}})
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	big := make([]events.Event, events.MaxShippedBatch+1)
	for i := range big {
		big[i] = events.Event{Type: events.SessionEnd}
	}
	err = node.ShipEvents(ctx, big)
	require.True(t, trace.IsBadParameter(err), "%v", err)
}

// TestLoginRateLimitAudited: a login refused by the rate limit (per user
// or per source address) is an auth.failed naming the address and the
// reason, told apart from a wrong password.
func TestLoginRateLimitAudited(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "alice", []byte("correct horse battery"), []string{"alice"}, nil, false)
	require.NoError(t, err)
	for range DefaultMaxLoginFailures {
		_, err := env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "alice", Password: "wrong", RemoteAddr: "192.0.2.7:5555"})
		require.True(t, trace.IsAccessDenied(err), "%v", err)
	}
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "alice", Password: "wrong", RemoteAddr: "192.0.2.7:5555"})
	require.True(t, trace.IsLimitExceeded(err), "%v", err)
	e := waitEvent(t, rec, events.AuthFailed, func(e events.Event) bool {
		return e.Fields[events.FieldReason] != "invalid credentials"
	})
	require.Equal(t, "alice", e.User)
	require.Equal(t, "192.0.2.7:5555", e.Fields[events.FieldRemoteAddr])
	require.NotEmpty(t, e.Fields[events.FieldReason])
}

// TestTOTPReplayAudited: a TOTP code accepted once and sent again is
// refused like any wrong code (the caller learns nothing), but audited as
// a replay, which an operator can tell from a typo; a wrong code is still
// audited as invalid credentials.
func TestTOTPReplayAudited(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	otpURL, err := env.auth.CreateUser(ctx, "frank", []byte("pw"), []string{"frank"}, nil, true)
	require.NoError(t, err)
	u, err := url.Parse(otpURL)
	require.NoError(t, err)
	code, err := totp.GenerateCodeCustom(u.Query().Get("secret"), env.clock.Now(), totpOpts)
	require.NoError(t, err)
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))

	login := func(remote, otp string) error {
		_, err := proxy.AuthenticateUser(ctx, authapi.AuthRequest{User: "frank", Password: "pw", OTP: otp, RemoteAddr: remote})
		return err
	}
	failedFrom := func(remote string) events.Event {
		return waitEvent(t, rec, events.AuthFailed, func(e events.Event) bool { return e.Fields[events.FieldRemoteAddr] == remote })
	}

	typo := "000000"
	if code == typo {
		typo = "111111"
	}
	errTypo := login("10.0.0.1:1", typo)
	requireKind(t, errTypo, trace.IsAccessDenied, "invalid credentials")
	require.Equal(t, "invalid credentials", failedFrom("10.0.0.1:1").Fields[events.FieldReason])

	require.NoError(t, login("10.0.0.2:1", code))
	errReplay := login("10.0.0.3:1", code)
	requireKind(t, errReplay, trace.IsAccessDenied, "invalid credentials")
	require.Equal(t, trace.UserMessage(errTypo), trace.UserMessage(errReplay), "the caller cannot tell a replay from a typo")
	require.Equal(t, auditReasonOTPReplayed, failedFrom("10.0.0.3:1").Fields[events.FieldReason])
	require.Equal(t, "otp code already used", auditReasonOTPReplayed)
}
