package web

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// TestWebTerminalOpenSSHRequiredRecordingFails: a spool that fills up
// while a terminal whose role requires recording runs ends the terminal,
// saying why, and recording.failed names the role; as on a node.
func TestWebTerminalOpenSSHRequiredRecordingFails(t *testing.T) {
	if os.Geteuid() != 0 {
		srvtest.SkipOrFailInCI(t, "needs root: mounts a small tmpfs as the proxy's spool")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", 256<<10)); err != nil {
		srvtest.SkipOrFailInCI(t, "mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	e, rec, _ := openSSHEnv(t, true, services.RecordingNode, dir)
	carol := loginRequired(t, e)
	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, carol, TerminalParams{Host: "node1", Login: "carol", Cols: 80, Rows: 24})
	openTerminal(t, ctx, c, carol.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	start := waitAudit(t, rec, events.SessionStart, func(events.Event) bool { return true })
	require.Equal(t, true, start.Fields[events.FieldRecorded])
	// The spool's file system fills up, then output comes.
	fillDir(t, dir)
	require.NoError(t, c.Write(ctx, websocket.MessageBinary, EncodeFrame(FrameData, []byte("flood"))))
	f := readUntil(t, ctx, c, FrameError, "")
	require.Contains(t, string(f.Payload), `session recording is required by role "audited"`)
	failed := waitAudit(t, rec, events.RecordingFailed, func(events.Event) bool { return true })
	require.Equal(t, "audited", failed.Fields["required_by"])
	end := waitAudit(t, rec, events.SessionEnd, func(events.Event) bool { return true })
	require.Equal(t, false, end.Fields[events.FieldRecorded])
}

// fillDir writes a file into dir until its file system is full.
func fillDir(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 16<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			require.ErrorIs(t, err, unix.ENOSPC)
			return
		}
	}
}
