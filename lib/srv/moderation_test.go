package srv

import (
	"context"
	"io"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/party"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// moderatedEnv has a role "held" whose sessions need one auditor as
// moderator (on_leave as given) and a role "auditor" that may observe
// and moderate them.
func moderatedEnv(t *testing.T, onLeave string) (*testEnv, *events.Recorder) {
	rec := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) { c.Audit = rec })
	e.ap.UpsertRole(&services.Role{Kind: services.KindRole, Metadata: services.Metadata{Name: "held"}, Spec: services.RoleSpec{
		RequireSessionJoin: []services.SessionRequireRule{{Roles: []string{"access", "auditor"}, Modes: []string{"moderator"}, Count: 1, OnLeave: onLeave}},
	}})
	e.ap.UpsertRole(&services.Role{Kind: services.KindRole, Metadata: services.Metadata{Name: "auditor"}, Spec: services.RoleSpec{
		JoinSessions: []services.SessionJoinRule{{Roles: []string{"held"}, Modes: []string{"observer", "moderator"}}},
	}})
	return e, rec
}

// heldShell starts alice's shell under role held and returns it with
// the session id the waiting line names.
func heldShell(t *testing.T, e *testEnv) *ownerShell {
	t.Helper()
	signer := e.userCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Roles: []string{"access", "held"}, Cluster: testCluster, Now: e.clock.Now()})
	c, err := e.dialAs(e.me, signer)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s, err := c.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	o := &ownerShell{s: s, stdin: stdin, out: watchOutput(stdout)}
	require.NoError(t, s.Shell())
	out := o.out.waitFor(t, "waiting for a moderator")
	waitRE := regexp.MustCompile(`--mode moderator ([0-9a-f-]{36})\)`)
	require.Eventually(t, func() bool { return waitRE.MatchString(o.out.String()) }, 10*time.Second, 5*time.Millisecond, out)
	o.id = waitRE.FindStringSubmatch(o.out.String())[1]
	return o
}

// TestModeratedSessionWaitsAndPauses: a held session's shell does not
// run, and what its owner types is dropped, until a moderator joins (an
// observer does not count); when the moderator leaves, input pauses
// (dropped, not queued) until one is back.
func TestModeratedSessionWaitsAndPauses(t *testing.T) {
	e, rec := moderatedEnv(t, services.OnLeavePause)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := heldShell(t, e)
	_, err := rec.Wait(ctx, events.SessionModeration, func(ev events.Event) bool { return ev.Fields["state"] == "waiting" })
	require.NoError(t, err)
	o.typeLine(t, "echo early-$((1+1))")

	obs, err := join(t, e, "olga", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Observer))
	require.NoError(t, err)
	o.out.waitFor(t, "[postern: olga joined as observer]")
	require.NotContains(t, o.out.String(), "the session starts", "an observer does not count")

	mod, err := join(t, e, "mona", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Moderator))
	require.NoError(t, err)
	o.out.waitFor(t, "a moderator is present; the session starts")
	_, err = rec.Wait(ctx, events.SessionModeration, func(ev events.Event) bool { return ev.Fields["state"] == "started" })
	require.NoError(t, err)
	o.typeLine(t, "echo started-$((2+2))")
	o.out.waitFor(t, "started-4")
	obs.out.waitFor(t, "started-4")
	mod.out.waitFor(t, "started-4")
	require.NotContains(t, o.out.String(), "early-2", "typed while held: dropped")

	require.NoError(t, mod.s.Close())
	o.out.waitFor(t, "input is paused until one joins")
	o.typeLine(t, "echo paused-$((3+3))")
	mod2, err := join(t, e, "mona", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Moderator))
	require.NoError(t, err)
	o.out.waitFor(t, "a moderator is back; input resumed")
	_, err = io.WriteString(mod2.stdin, "echo resumed-$((4+4))\n")
	require.NoError(t, err)
	o.out.waitFor(t, "resumed-8")
	require.NotContains(t, o.out.String(), "paused-6", "typed while paused: dropped")
	_, err = rec.Wait(ctx, events.SessionModeration, func(ev events.Event) bool { return ev.Fields["state"] == "resumed" })
	require.NoError(t, err)
}

// TestModeratedSessionTerminates: with on_leave terminate the session
// ends when its last moderator leaves.
func TestModeratedSessionTerminates(t *testing.T) {
	e, rec := moderatedEnv(t, services.OnLeaveTerminate)
	o := heldShell(t, e)
	mod, err := join(t, e, "mona", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Moderator))
	require.NoError(t, err)
	o.out.waitFor(t, "the session starts")
	o.typeLine(t, "echo running-$((5*5))")
	mod.out.waitFor(t, "running-25")
	require.NoError(t, mod.s.Close())
	o.out.waitFor(t, "the last moderator left; the session ends")
	done := make(chan error, 1)
	go func() { done <- o.s.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not end")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = rec.Wait(ctx, events.SessionModeration, func(ev events.Event) bool { return ev.Fields["state"] == "terminated" })
	require.NoError(t, err)
}

// TestModeratedExecNeedsPTY: a held user's command without a terminal
// cannot be watched, and is refused rather than run unwatched.
func TestModeratedExecNeedsPTY(t *testing.T) {
	e, _ := moderatedEnv(t, services.OnLeavePause)
	signer := e.userCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Roles: []string{"access", "held"}, Cluster: testCluster, Now: e.clock.Now()})
	c, err := e.dialAs(e.me, signer)
	require.NoError(t, err)
	defer c.Close()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	stderr, err := s.StderrPipe()
	require.NoError(t, err)
	w := watchOutput(stderr)
	require.Error(t, s.Start("echo unwatched"))
	w.waitFor(t, "only interactive sessions with a terminal can be moderated")
}

// TestModeratorEndsHeldSession: a moderator who joined a session still
// waiting for more moderators ends it with `Ctrl-] t` (a signal on the
// join channel): the shell never runs, the owner's session ends, and the
// end is audited.
func TestModeratorEndsHeldSession(t *testing.T) {
	e, rec := moderatedEnv(t, services.OnLeavePause)
	e.ap.UpsertRole(&services.Role{Kind: services.KindRole, Metadata: services.Metadata{Name: "held"}, Spec: services.RoleSpec{
		RequireSessionJoin: []services.SessionRequireRule{{Roles: []string{"auditor"}, Modes: []string{"moderator"}, Count: 2, OnLeave: services.OnLeavePause}},
	}})
	o := heldShell(t, e)
	mod, err := join(t, e, "mona", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Moderator))
	require.NoError(t, err)
	o.out.waitFor(t, "[postern: mona joined as moderator]")
	require.NotContains(t, o.out.String(), "the session starts", "one of two moderators")

	ok, err := mod.s.SendRequest("signal", true, ssh.Marshal(signalRequest{Signal: "HUP"}))
	require.NoError(t, err)
	require.True(t, ok, "a moderator ends a held session")
	o.out.waitFor(t, "[postern: mona (moderator) ended the session]")
	done := make(chan error, 1)
	go func() { done <- o.s.Wait() }()
	select {
	case err := <-done:
		var exit *ssh.ExitError
		require.ErrorAs(t, err, &exit)
		require.Equal(t, exitNotStarted, exit.ExitStatus())
	case <-time.After(20 * time.Second):
		t.Fatal("the held session did not end")
	}
	require.NotContains(t, o.out.String(), "the session starts")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = rec.Wait(ctx, events.SessionModeration, func(ev events.Event) bool {
		return ev.Fields["state"] == "terminated" && ev.Fields[events.FieldSessionID] == o.id
	})
	require.NoError(t, err)
}
