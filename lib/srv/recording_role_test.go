package srv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// roleWithRecording is the access role under another name with
// session_recording set to mode.
func roleWithRecording(name, mode string) *services.Role {
	r := srvtest.AccessRole()
	r.Metadata.Name = name
	r.Spec.SessionRecording = mode
	return r
}

// dialWithRoles connects as the current OS user holding roles.
func (e *testEnv) dialWithRoles(t *testing.T, roles ...string) *ssh.Client {
	t.Helper()
	s := e.userCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Roles: roles, Cluster: testCluster, Now: e.clock.Now()})
	c, err := e.dialAs(e.me, s)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// ptyRun runs cmd (unique in the test: it finds the events) with a pty
// and returns the session.start and
// session.end audit events of the session.
func ptyRun(t *testing.T, c *ssh.Client, audit *events.Recorder, cmd string) (start, end events.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	_, err = s.Output(cmd)
	require.NoError(t, err)
	st, err := audit.Wait(ctx, events.SessionStart, func(ev events.Event) bool { return ev.Fields[events.FieldCommand] == cmd })
	require.NoError(t, err)
	sid := st.Fields[events.FieldSessionID]
	e, err := audit.Wait(ctx, events.SessionEnd, func(ev events.Event) bool { return ev.Fields[events.FieldSessionID] == sid })
	require.NoError(t, err)
	return st, e
}

// A role with session_recording: require records the holder's sessions
// even though the cluster says off; one without does not, on the same node.
func TestRoleRequiresRecordingWhenClusterIsOff(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{SessionRecording: services.RecordingOff})
	e.ap.UpsertRole(roleWithRecording("audited", services.RecordingRequire))
	ctx := context.Background()

	start, end := ptyRun(t, e.dialWithRoles(t, "access", "audited"), audit, "echo required-and-recorded")
	final, _ := end.Fields[events.FieldRecordingHash].(string)
	require.NotEmpty(t, final, "a role that requires recording beats the cluster's off")
	require.Equal(t, true, start.Fields[events.FieldRecorded])
	require.Nil(t, start.Fields[events.FieldRecordingReason])
	chunks, err := recording.GetChunks(ctx, spool, end.Fields[events.FieldSessionID].(string))
	require.NoError(t, err)
	_, err = recording.Verify(chunks, final)
	require.NoError(t, err)

	start, end = ptyRun(t, e.dialWithRoles(t, "access"), audit, "echo not-recorded")
	require.Nil(t, end.Fields[events.FieldRecordingHash])
	require.Equal(t, false, start.Fields[events.FieldRecorded])
	require.Equal(t, "cluster session_recording is off", start.Fields[events.FieldRecordingReason])
}

// session_recording: exempt leaves the holder's sessions unrecorded and
// says so in session.start; require in another of the user's roles wins.
func TestRoleExemptsRecordingUnlessAnotherRequires(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{})
	e.ap.UpsertRole(roleWithRecording("exempt", services.RecordingExempt))
	e.ap.UpsertRole(roleWithRecording("audited", services.RecordingRequire))
	ctx := context.Background()

	start, end := ptyRun(t, e.dialWithRoles(t, "exempt"), audit, "echo exempt")
	require.Nil(t, end.Fields[events.FieldRecordingHash])
	require.Equal(t, false, start.Fields[events.FieldRecorded])
	require.Equal(t, `exempt by role "exempt"`, start.Fields[events.FieldRecordingReason])
	list, err := spool.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list)

	start, end = ptyRun(t, e.dialWithRoles(t, "exempt", "audited"), audit, "echo exempt-but-required")
	require.NotEmpty(t, end.Fields[events.FieldRecordingHash], "require beats exempt")
	require.Equal(t, true, start.Fields[events.FieldRecorded])
}

// A session whose recording a role requires is refused, with the reason
// on the client's stderr and in access.denied, when the node cannot record
// it: a node without a recorder, or recording settings it cannot read.
// Without the role the same node lets the session run unrecorded.
func TestRequiredRecordingRefusedWhenItCannotHappen(t *testing.T) {
	for _, tc := range []struct {
		name     string
		recorder func(t *testing.T) *Recorder
		why      string
	}{
		{"node does not record", func(*testing.T) *Recorder { return nil }, "this node does not record sessions"},
		{"settings unreadable", func(t *testing.T) *Recorder {
			r, err := NewRecorder(RecorderConfig{Spool: recording.DirStorage{Dir: t.TempDir()}, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
				return nil, errors.New("auth server unreachable")
			}})
			require.NoError(t, err)
			return r
		}, "the cluster's recording settings could not be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			audit := events.NewRecorder()
			e := newTestEnv(t, func(c *Config) {
				c.Recorder = tc.recorder(t)
				c.Audit = audit
			})
			e.ap.UpsertRole(roleWithRecording("audited", services.RecordingRequire))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			for _, withPty := range []bool{true, false} {
				s, err := e.dialWithRoles(t, "access", "audited").NewSession()
				require.NoError(t, err)
				if withPty {
					require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
				}
				stderr, err := s.StderrPipe()
				require.NoError(t, err)
				errOut := watchOutput(stderr)
				cmd := fmt.Sprintf("echo must-not-run-%v", withPty)
				out, err := s.Output(cmd)
				require.Error(t, err, "pty=%v", withPty)
				require.NotContains(t, string(out), "must-not-run")
				errOut.waitFor(t, `postern: session recording is required by role "audited" and `+tc.why+"; the session is refused")
				denied, err := audit.Wait(ctx, events.AccessDenied, func(ev events.Event) bool { return ev.Fields[events.FieldTarget] == cmd })
				require.NoError(t, err)
				require.Contains(t, denied.Fields[events.FieldReason], tc.why)
				for _, ev := range audit.Events() {
					require.False(t, ev.Type == events.SessionStart && ev.Fields[events.FieldCommand] == cmd, "a refused session never starts")
				}
				s.Close()
			}

			start, _ := ptyRun(t, e.dialWithRoles(t, "access"), audit, "echo runs-unrecorded")
			require.Equal(t, false, start.Fields[events.FieldRecorded])
			require.Equal(t, tc.why, start.Fields[events.FieldRecordingReason])
		})
	}
}
