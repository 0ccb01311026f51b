package srv

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// requireRootFS skips a test that needs root to break a file system on
// purpose (chattr +i, a tmpfs mount). CI runs as root, so there the skip
// would hide a broken set-up: it fails instead.
func requireRootFS(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		srvtest.SkipOrFailInCI(t, "needs root: makes the recording spool immutable or full")
	}
}

// immutable sets the immutable attribute on dir (chattr +i: not even root
// may create anything in it) until the test ends.
func immutable(t *testing.T, dir string) {
	t.Helper()
	out, err := exec.Command("chattr", "+i", dir).CombinedOutput()
	if err != nil {
		srvtest.SkipOrFailInCI(t, "chattr +i %s: %v: %s (.ci/run installs e2fsprogs)", dir, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", dir).Run() })
}

// smallTmpfs mounts a tmpfs of size bytes on a fresh directory until the
// test ends.
func smallTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		srvtest.SkipOrFailInCI(t, "mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// fill writes a file into dir until its file system is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			require.ErrorIs(t, err, unix.ENOSPC)
			return
		}
	}
}

func recordingEnvAt(t *testing.T, spool recording.DirStorage) (*testEnv, *events.Recorder) {
	audit := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) {
		r, err := NewRecorder(RecorderConfig{Spool: spool, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
			cfg := &services.ClusterNetworkingConfig{}
			return cfg, cfg.CheckAndSetDefaults()
		}})
		require.NoError(t, err)
		c.Recorder = r
		c.Audit = audit
	})
	return e, audit
}

// The attack: the node's spool is made immutable (chattr +i), so that no
// recording can be written. A session whose role requires recording is
// refused before its command runs, with the reason on its stderr and an
// access.denied event; without the role the session runs and session.start
// says recorded: false and why, never recorded: true with nothing stored.
func TestRequiredRecordingRefusedWhenTheSpoolIsImmutable(t *testing.T) {
	requireRootFS(t)
	spool := recording.DirStorage{Dir: t.TempDir()}
	e, audit := recordingEnvAt(t, spool)
	e.ap.UpsertRole(roleWithRecording("audited", services.RecordingRequire))
	immutable(t, spool.Dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	marker := filepath.Join(t.TempDir(), "ran")
	for _, withPty := range []bool{true, false} {
		s, err := e.dialWithRoles(t, "access", "audited").NewSession()
		require.NoError(t, err)
		if withPty {
			require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
		}
		stderr, err := s.StderrPipe()
		require.NoError(t, err)
		errOut := watchOutput(stderr)
		cmd := fmt.Sprintf("touch %s-%v; echo must-not-run", marker, withPty)
		out, err := s.Output(cmd)
		require.Error(t, err, "pty=%v", withPty)
		require.NotContains(t, string(out), "must-not-run")
		errOut.waitFor(t, `postern: session recording is required by role "audited" and the node's recording spool cannot be written; the session is refused`)
		_, statErr := os.Stat(fmt.Sprintf("%s-%v", marker, withPty))
		require.True(t, os.IsNotExist(statErr), "the command never ran")
		denied, err := audit.Wait(ctx, events.AccessDenied, func(ev events.Event) bool { return ev.Fields[events.FieldTarget] == cmd })
		require.NoError(t, err)
		require.Contains(t, denied.Fields[events.FieldReason], "recording spool cannot be written")
		for _, ev := range audit.Events() {
			require.False(t, ev.Type == events.SessionStart && ev.Fields[events.FieldCommand] == cmd, "a refused session never starts")
		}
		s.Close()
	}

	start, end := ptyRun(t, e.dialWithRoles(t, "access"), audit, "echo runs-unrecorded")
	require.Equal(t, false, start.Fields[events.FieldRecorded], "recorded means stored: %v", start.Fields)
	require.Equal(t, "the node's recording spool cannot be written", start.Fields[events.FieldRecordingReason])
	require.Nil(t, end.Fields[events.FieldRecordingHash])
}

// A recording that fails mid-session (the spool's file system fills up):
// a session whose role requires recording is ended with a message on its
// stderr and a recording.failed event, its output stops, and session.end
// says recorded: false (no final hash); what was stored before the failure
// is a valid, incomplete recording. A session without the role goes on to
// its end, unrecorded from the failure on, and says so the same way.
func TestRecordingFailsMidSession(t *testing.T) {
	requireRootFS(t)
	for _, required := range []bool{true, false} {
		t.Run(fmt.Sprintf("required=%v", required), func(t *testing.T) {
			dir := smallTmpfs(t, 1<<20)
			spool := recording.DirStorage{Dir: filepath.Join(dir, "spool")}
			e, audit := recordingEnvAt(t, spool)
			e.ap.UpsertRole(roleWithRecording("audited", services.RecordingRequire))
			roles := []string{"access"}
			if required {
				roles = append(roles, "audited")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := e.dialWithRoles(t, roles...).NewSession()
			require.NoError(t, err)
			defer s.Close()
			require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
			stdout, err := s.StdoutPipe()
			require.NoError(t, err)
			stderr, err := s.StderrPipe()
			require.NoError(t, err)
			stdin, err := s.StdinPipe()
			require.NoError(t, err)
			out, errOut := watchOutput(stdout), watchOutput(stderr)
			const cmd = `echo started; read x; head -c 8000000 /dev/urandom | base64 -w 0; echo; echo FINISHED-$((40+2))`
			require.NoError(t, s.Start(cmd))
			out.waitFor(t, "started")
			start, err := audit.Wait(ctx, events.SessionStart, nil)
			require.NoError(t, err)
			require.Equal(t, true, start.Fields[events.FieldRecorded])
			sid := start.Fields[events.FieldSessionID].(string)

			fill(t, dir)
			_, err = io.WriteString(stdin, "\n")
			require.NoError(t, err)
			waitErr := s.Wait()

			failed, err := audit.Wait(ctx, events.RecordingFailed, nil)
			require.NoError(t, err)
			require.Equal(t, sid, failed.Fields[events.FieldSessionID])
			require.Contains(t, failed.Fields[events.FieldReason], "could not be stored")
			end, err := audit.Wait(ctx, events.SessionEnd, nil)
			require.NoError(t, err)
			require.Equal(t, false, end.Fields[events.FieldRecorded], "session.end: %v", end.Fields)
			require.Nil(t, end.Fields[events.FieldRecordingHash], "no final hash for a recording that was not stored")
			if required {
				require.Error(t, waitErr, "the session is ended")
				errOut.waitFor(t, `postern: session recording is required by role "audited" and the recording could not be stored on the node`)
				require.Equal(t, "audited", failed.Fields["required_by"])
				require.NotContains(t, out.String(), "FINISHED-42")
			} else {
				require.NoError(t, waitErr, "the session goes on")
				out.waitFor(t, "FINISHED-42")
				require.Nil(t, failed.Fields["required_by"])
				require.False(t, strings.Contains(errOut.String(), "postern:"), "nothing to tell the user: %q", errOut.String())
			}

			// What the spool took before it filled up verifies as an
			// incomplete recording (no hole, no final chunk).
			require.NoError(t, os.Remove(filepath.Join(dir, "filler")))
			chunks, err := recording.GetChunks(ctx, spool, sid)
			require.NoError(t, err)
			res, err := recording.Verify(chunks, "")
			require.NoError(t, err)
			require.False(t, res.Complete)
		})
	}
}
