package srv

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

func recordingEnv(t *testing.T, spec services.ClusterNetworkingConfigSpec) (*testEnv, recording.DirStorage, *events.Recorder) {
	spool := recording.DirStorage{Dir: t.TempDir()}
	audit := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) {
		r, err := NewRecorder(RecorderConfig{Spool: spool, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
			cfg := &services.ClusterNetworkingConfig{Spec: spec}
			return cfg, cfg.CheckAndSetDefaults()
		}})
		require.NoError(t, err)
		c.Recorder = r
		c.Audit = audit
	})
	return e, spool, audit
}

// A pty session is recorded: header, output in order, the resize, and
// the exit status as the last marker; session.end carries the final hash,
// which the stored chunks verify against.
func TestPTYSessionIsRecorded(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	require.NoError(t, s.Start(`for i in 1 2 3; do echo "count $i"; done; read x; until [ "$(stty size)" = "30 100" ]; do sleep 0.05; done; echo after-resize; exit 3`))
	w.waitFor(t, "count 3")
	// The window change and the input travel as separate messages that
	// the node handles independently, so the shell waits until the pty
	// has the new size before it ends: the resize is in the recording.
	require.NoError(t, s.WindowChange(30, 100))
	_, err = stdin.Write([]byte("secret-input\n"))
	require.NoError(t, err)
	w.waitFor(t, "after-resize")
	var exitErr *ssh.ExitError
	require.ErrorAs(t, s.Wait(), &exitErr)
	require.Equal(t, 3, exitErr.ExitStatus())

	end, err := audit.Wait(ctx, events.SessionEnd, nil)
	require.NoError(t, err)
	final, _ := end.Fields[events.FieldRecordingHash].(string)
	require.NotEmpty(t, final, "session.end carries the recording's final hash")
	sid := end.Fields[events.FieldSessionID].(string)

	chunks, err := recording.GetChunks(ctx, spool, sid)
	require.NoError(t, err)
	res, err := recording.Verify(chunks, final)
	require.NoError(t, err)
	require.True(t, res.Complete)
	var cast bytes.Buffer
	require.NoError(t, recording.Export(&cast, chunks))
	h, evs, err := recording.Parse(cast.Bytes())
	require.NoError(t, err)
	require.Equal(t, "alice", h.User)
	require.Equal(t, e.me, h.Login)
	require.Equal(t, "5f1c-node-uuid", h.Node)
	require.Equal(t, uint32(80), h.Width)
	require.Equal(t, "xterm", h.Env["TERM"])

	var out strings.Builder
	var kinds []string
	for _, ev := range evs {
		switch ev.Code {
		case "o":
			out.WriteString(ev.Data)
		case "i":
			t.Fatal("input is not recorded unless record_input is on")
		default:
			kinds = append(kinds, ev.Code+":"+ev.Data)
		}
	}
	require.Regexp(t, `(?s)count 1.*count 2.*count 3.*after-resize`, out.String())
	require.Equal(t, "m:exec: "+`for i in 1 2 3; do echo "count $i"; done; read x; until [ "$(stty size)" = "30 100" ]; do sleep 0.05; done; echo after-resize; exit 3`, kinds[0])
	require.Contains(t, kinds, "r:100x30")
	require.Equal(t, "m:exit-status 3", kinds[len(kinds)-1])
}

// session_recording: off records nothing.
func TestRecordingOffAndNoPTY(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{SessionRecording: services.RecordingOff})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	_, err = s.Output("echo hi")
	require.NoError(t, err)
	end, err := audit.Wait(ctx, events.SessionEnd, nil)
	require.NoError(t, err)
	require.Nil(t, end.Fields[events.FieldRecordingHash])
	list, err := spool.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list)
}

// The per-session cap is 256 MiB unless the cluster sets one, whichever
// way the node gets its settings: the defaults auth answers with when no
// networking config was ever stored, and a config whose cap is left at
// zero. session.start says the cap the session's recording has in
// effect (TestWriterCapsAtTheDefault in lib/recording shows a writer with
// that default stops at exactly 256 MiB; the integration test
// TestRecordingCapStopsRecordingNotSession a configured cap through a
// real session).
func TestRecordingCapDefaultIs256MiB(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings func() *services.ClusterNetworkingConfig
		want     int64
	}{
		{"cluster defaults", services.DefaultClusterNetworkingConfig, 256 << 20},
		{"cap left at zero", func() *services.ClusterNetworkingConfig {
			return &services.ClusterNetworkingConfig{Spec: services.ClusterNetworkingConfigSpec{SessionRecording: services.RecordingNode}}
		}, 256 << 20},
		{"configured", func() *services.ClusterNetworkingConfig {
			return &services.ClusterNetworkingConfig{Spec: services.ClusterNetworkingConfigSpec{MaxRecordingBytes: 4 << 20}}
		}, 4 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			audit := events.NewRecorder()
			e := newTestEnv(t, func(c *Config) {
				r, err := NewRecorder(RecorderConfig{Spool: recording.DirStorage{Dir: t.TempDir()}, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
					return tc.settings(), nil
				}})
				require.NoError(t, err)
				c.Recorder = r
				c.Audit = audit
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s, err := e.dial().NewSession()
			require.NoError(t, err)
			require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
			_, err = s.Output("echo hi")
			require.NoError(t, err)
			start, err := audit.Wait(ctx, events.SessionStart, nil)
			require.NoError(t, err)
			require.Equal(t, true, start.Fields[events.FieldRecorded])
			require.Equal(t, tc.want, start.Fields["max_recording_bytes"], "session.start: %v", start.Fields)
		})
	}
}
