package srv

import (
	"context"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/party"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// auditorRole may join access sessions in the given modes.
func auditorRole(name string, modes ...string) *services.Role {
	return &services.Role{Kind: services.KindRole, Metadata: services.Metadata{Name: name}, Spec: services.RoleSpec{
		JoinSessions: []services.SessionJoinRule{{Roles: []string{"access"}, Modes: modes}},
	}}
}

// ownerShell is a pty shell of alice's on e, and its session id.
type ownerShell struct {
	s     *ssh.Session
	stdin io.Writer
	out   *outputWatcher
	id    string
}

func startOwnerShell(t *testing.T, e *testEnv) *ownerShell {
	t.Helper()
	c := e.dial()
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
	_, err = io.WriteString(stdin, "echo id$((1+1))=$SSH_SESSION_ID.\n")
	require.NoError(t, err)
	idRE := regexp.MustCompile(`id2=([0-9a-f-]{36})\.`)
	require.Eventually(t, func() bool { return idRE.MatchString(o.out.String()) }, 10*time.Second, 5*time.Millisecond)
	o.id = idRE.FindStringSubmatch(o.out.String())[1]
	return o
}

func (o *ownerShell) typeLine(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(o.stdin, line+"\n")
	require.NoError(t, err)
}

// joiner is a join channel of a user's. x/crypto's Session starts its
// stdio copies only for shell and exec, so the channel's streams are read
// directly.
type joiner struct {
	s      *ssh.Session
	stdin  io.Writer
	out    *outputWatcher
	stderr *outputWatcher
}

// ended waits for the join channel's output to end.
func (j *joiner) ended(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		j.out.mu.Lock()
		defer j.out.mu.Unlock()
		return j.out.closed
	}, 15*time.Second, 5*time.Millisecond, "the join channel's output ends")
}

// join opens a join channel to subsystem as user with roles; err is the
// subsystem request's.
func join(t *testing.T, e *testEnv, user string, roles []string, subsystem string) (*joiner, error) {
	t.Helper()
	signer := e.userCA.UserSigner(t, srvtest.UserCert{User: user, Logins: []string{e.me}, Roles: roles, Cluster: testCluster, Now: e.clock.Now()})
	c, err := e.dialAs(e.me, signer)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s, err := c.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	j := &joiner{s: s}
	j.stdin, err = s.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	stderr, err := s.StderrPipe()
	require.NoError(t, err)
	j.out, j.stderr = watchOutput(stdout), watchOutput(stderr)
	return j, s.RequestSubsystem(subsystem)
}

// TestJoinModes: an observer sees the screen and the output live and
// cannot type; a peer types into the owner's shell; only a moderator ends
// the session for everyone. Everyone reads who joined and left; joins and
// leaves are audited and marked.
func TestJoinModes(t *testing.T) {
	rec := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) { c.Audit = rec })
	e.ap.UpsertRole(auditorRole("auditor", "observer", "peer", "moderator"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := startOwnerShell(t, e)

	obs, err := join(t, e, "olga", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Observer))
	require.NoError(t, err)
	obs.out.waitFor(t, "id2="+o.id) // the screen as it was
	o.out.waitFor(t, "[postern: olga joined as observer]")
	ev, err := rec.Wait(ctx, events.SessionJoin, nil)
	require.NoError(t, err)
	require.Equal(t, "olga", ev.User)
	require.Equal(t, o.id, ev.Fields[events.FieldSessionID])
	require.Equal(t, "observer", ev.Fields["mode"])
	require.Equal(t, "alice", ev.Fields["session_user"])

	o.typeLine(t, "echo owner-$((6*7))")
	obs.out.waitFor(t, "owner-42")
	_, err = io.WriteString(obs.stdin, "echo observer-$((3*3))\n")
	require.NoError(t, err)
	obs.out.waitFor(t, "what you type is not sent")
	o.typeLine(t, "echo sync-$((1+2))")
	o.out.waitFor(t, "sync-3")
	require.NotContains(t, o.out.String(), "observer-", "an observer's keystrokes never reach the shell")

	peer, err := join(t, e, "pete", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Peer))
	require.NoError(t, err)
	obs.out.waitFor(t, "[postern: pete joined as peer]")
	_, err = io.WriteString(peer.stdin, "echo peer-$((5*5))\n")
	require.NoError(t, err)
	o.out.waitFor(t, "peer-25")
	obs.out.waitFor(t, "peer-25")
	ok, err := peer.s.SendRequest("signal", true, ssh.Marshal(signalRequest{Signal: "HUP"}))
	require.NoError(t, err)
	require.False(t, ok, "a peer cannot end the session")
	require.NoError(t, peer.s.Close())
	o.out.waitFor(t, "[postern: pete (peer) left]")
	_, err = rec.Wait(ctx, events.SessionLeave, func(ev events.Event) bool { return ev.User == "pete" })
	require.NoError(t, err)

	mod, err := join(t, e, "mona", []string{"access", "auditor"}, party.JoinSubsystem(o.id, party.Moderator))
	require.NoError(t, err)
	mod.out.waitFor(t, "peer-25")
	ok, err = mod.s.SendRequest("signal", true, ssh.Marshal(signalRequest{Signal: "HUP"}))
	require.NoError(t, err)
	require.True(t, ok, "a moderator ends the session")
	o.out.waitFor(t, "[postern: mona (moderator) ended the session]")
	_ = o.s.Wait() // the shell was hung up
	obs.ended(t)
	mod.ended(t)
	_, err = rec.Wait(ctx, events.SessionModeration, func(ev events.Event) bool { return ev.Fields["state"] == "terminated" })
	require.NoError(t, err)
	_, err = e.srv.parties.Get(o.id)
	require.Error(t, err)
}

// TestJoinNotFound (attack): a valid certificate without a join right, a
// forged session id and a mode the role does not grant all read the same
// "not found"; a malformed id is refused as such. Each is audited.
func TestJoinNotFound(t *testing.T) {
	rec := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) { c.Audit = rec })
	e.ap.UpsertRole(auditorRole("watcher", "observer"))
	o := startOwnerShell(t, e)
	forged := uuid.NewString()
	for _, tc := range []struct {
		name, subsystem string
		roles           []string
		want            string
	}{
		{"no join right", party.JoinSubsystem(o.id, party.Observer), []string{"access"}, "session " + o.id + " not found"},
		{"mode not granted", party.JoinSubsystem(o.id, party.Peer), []string{"access", "watcher"}, "session " + o.id + " not found"},
		{"forged id", party.JoinSubsystem(forged, party.Observer), []string{"access", "watcher"}, "session " + forged + " not found"},
		{"malformed id", "join@../../etc/passwd", []string{"access", "watcher"}, "malformed session id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, err := join(t, e, "mallory", tc.roles, tc.subsystem)
			require.Error(t, err)
			j.stderr.waitFor(t, tc.want)
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := rec.Wait(ctx, events.AccessDenied, func(ev events.Event) bool {
		return ev.Fields[events.FieldKind] == "session.join" && strings.Contains(ev.Fields[events.FieldReason].(string), "no join_sessions rule")
	})
	require.NoError(t, err)
	require.NotContains(t, o.out.String(), "mallory", "a refused join is not announced")
}

// TestListRooms: the "sessions" subsystem lists a live pty session to a
// user whose roles may join it, and to nobody else.
func TestListRooms(t *testing.T) {
	e := newTestEnv(t)
	e.ap.UpsertRole(auditorRole("watcher", "observer"))
	o := startOwnerShell(t, e)
	list := func(roles ...string) []party.Info {
		j, err := join(t, e, "lister", roles, party.ListSubsystem)
		require.NoError(t, err)
		j.ended(t)
		var out []party.Info
		require.NoError(t, json.Unmarshal([]byte(j.out.String()), &out), j.out.String())
		return out
	}
	got := list("access", "watcher")
	require.Len(t, got, 1)
	require.Equal(t, o.id, got[0].ID)
	require.Equal(t, "alice", got[0].User)
	require.Equal(t, e.me, got[0].Login)
	require.Equal(t, []string{"alice"}, got[0].Participants)
	require.Empty(t, list("access"), "a user who may not join does not see the session")
}
