package srv

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

func waitAudit(t *testing.T, rec *events.Recorder, typ string, match func(events.Event) bool) events.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := rec.Wait(ctx, typ, match)
	require.NoError(t, err, "audited so far: %v", rec.Events())
	return e
}

func kindIs(kind string) func(events.Event) bool {
	return func(e events.Event) bool { return e.Fields[events.FieldKind] == kind }
}

// TestAuditForwardRefusals: -L, -R and -A refused by the role are
// access.denied events naming the kind, the target and the reason, with
// the connection's user, login and node.
func TestAuditForwardRefusals(t *testing.T) {
	rec := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) { c.Audit = rec })
	role := srvtest.AccessRole()
	role.Spec.PortForwarding = false
	role.Spec.ForwardAgent = false
	e.ap.UpsertRole(role)
	c := e.dial()

	target := echoServer(t)
	_, err := c.Dial("tcp", target)
	require.Error(t, err)
	l := waitAudit(t, rec, events.AccessDenied, kindIs("-L"))
	require.Equal(t, target, l.Fields[events.FieldTarget])
	require.Contains(t, l.Fields[events.FieldReason], "port forwarding is not allowed")
	require.Equal(t, "alice", l.User)
	require.Equal(t, e.me, l.Fields[events.FieldLogin])
	require.Equal(t, e.node.UUID, l.Fields[events.FieldServerID])
	require.NotEmpty(t, l.Fields[events.FieldConnID])

	_, err = c.Listen("tcp", "127.0.0.1:0")
	require.Error(t, err)
	r := waitAudit(t, rec, events.AccessDenied, kindIs("-R"))
	require.Equal(t, "127.0.0.1:0", r.Fields[events.FieldTarget])
	require.Contains(t, r.Fields[events.FieldReason], "port forwarding is not allowed")

	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.Error(t, agent.RequestAgentForwarding(s))
	a := waitAudit(t, rec, events.AccessDenied, kindIs("-A"))
	require.Contains(t, a.Fields[events.FieldReason], "agent forwarding is not allowed")
	require.Equal(t, l.Fields[events.FieldConnID], a.Fields[events.FieldConnID], "one connection")
}

// TestAuditSessionRefusedOnOpenConnection: a role deleted while a
// connection stays open refuses its next session, and that is audited.
func TestAuditSessionRefusedOnOpenConnection(t *testing.T) {
	rec := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) { c.Audit = rec })
	c := e.dial()
	out, _, err := run(t, c, "echo ok")
	require.NoError(t, err)
	require.Equal(t, "ok\n", out)

	e.ap.DeleteRole("access")
	_, err = c.NewSession()
	require.Error(t, err)
	d := waitAudit(t, rec, events.AccessDenied, kindIs("session"))
	require.Equal(t, "alice", d.User)
	require.Equal(t, e.node.UUID, d.Fields[events.FieldServerID])
	require.Contains(t, d.Fields[events.FieldReason], "no role matches")
}

// flakyAccessPoint is the access point with an outage switch per call:
// the auth server or its backend gone.
type flakyAccessPoint struct {
	AccessPoint
	caDown, rolesDown atomic.Bool
}

func (f *flakyAccessPoint) GetCertAuthority(ctx context.Context, cluster string, t services.CertAuthType, secrets bool) (*services.CertAuthority, error) {
	if f.caDown.Load() {
		return nil, trace.ConnectionProblem(nil, "auth server at 127.0.0.1:3025: connection refused")
	}
	return f.AccessPoint.GetCertAuthority(ctx, cluster, t, secrets)
}

func (f *flakyAccessPoint) GetRole(ctx context.Context, name string) (*services.Role, error) {
	if f.rolesDown.Load() {
		return nil, trace.ConnectionProblem(nil, "backend unavailable")
	}
	return f.AccessPoint.GetRole(ctx, name)
}

// TestAuditDeniedWhileBackendDown: a user refused because the user CA or
// the roles cannot be read is an access.denied saying so.
func TestAuditDeniedWhileBackendDown(t *testing.T) {
	rec := events.NewRecorder()
	var flaky *flakyAccessPoint
	e := newTestEnv(t, func(c *Config) {
		c.Audit = rec
		flaky = &flakyAccessPoint{AccessPoint: c.AccessPoint}
		c.AccessPoint = flaky
	})

	flaky.caDown.Store(true)
	_, err := ssh.Dial("tcp", e.addr, e.clientConfig(e.me, e.signer(e.me)))
	require.Error(t, err)
	d := waitAudit(t, rec, events.AccessDenied, nil)
	require.Equal(t, "alice", d.User)
	require.Contains(t, d.Fields[events.FieldReason], "auth server or backend unavailable")
	require.Contains(t, d.Fields[events.FieldReason], "connection refused")
	require.Equal(t, e.me, d.Fields[events.FieldLogin])

	flaky.caDown.Store(false)
	flaky.rolesDown.Store(true)
	_, err = ssh.Dial("tcp", e.addr, e.clientConfig(e.me, e.signer(e.me)))
	require.Error(t, err)
	waitAudit(t, rec, events.AccessDenied, func(e events.Event) bool {
		r, _ := e.Fields[events.FieldReason].(string)
		return strings.HasPrefix(r, "auth server or backend unavailable: fetching role") && strings.Contains(r, "backend unavailable")
	})
}

// TestAuditCapRefusals: a connection or a channel refused by a per-user
// cap is audited with the reason.
func TestAuditCapRefusals(t *testing.T) {
	rec := events.NewRecorder()
	lim, err := limiter.NewConnectionLimiter(limiter.Config{Name: "test", MaxConnectionsPerUser: 1, MaxSessionsPerUser: 1})
	require.NoError(t, err)
	e := newTestEnv(t, func(c *Config) { c.Limiter = lim; c.Audit = rec })
	first := e.dial()
	s1, err := first.NewSession()
	require.NoError(t, err)
	defer s1.Close()
	_, err = first.NewSession()
	require.Error(t, err)
	ch := waitAudit(t, rec, events.AccessDenied, kindIs("session"))
	require.Contains(t, ch.Fields[events.FieldReason], `too many sessions for user "alice"`)

	second, err := e.dialAs(e.me, e.signer(e.me))
	require.NoError(t, err)
	defer second.Close()
	_, _ = second.NewSession()
	conn := waitAudit(t, rec, events.AccessDenied, kindIs("connection"))
	require.Equal(t, "alice", conn.User)
	require.Contains(t, conn.Fields[events.FieldReason], `too many connections for user "alice"`)
	require.Equal(t, e.node.UUID, conn.Fields[events.FieldServerID])
}
