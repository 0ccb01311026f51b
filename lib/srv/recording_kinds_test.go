package srv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// recordingOfEnd waits for the session.end whose session ran command
// (session.start says which) and returns its verified recording.
func recordingOfEnd(t *testing.T, ctx context.Context, spool recording.DirStorage, audit *events.Recorder, command string) (*recording.Header, []recording.Event) {
	t.Helper()
	start, err := audit.Wait(ctx, events.SessionStart, func(e events.Event) bool { return e.Fields[events.FieldCommand] == command })
	require.NoError(t, err)
	sid := start.Fields[events.FieldSessionID]
	end, err := audit.Wait(ctx, events.SessionEnd, func(e events.Event) bool { return e.Fields[events.FieldSessionID] == sid })
	require.NoError(t, err)
	final, _ := end.Fields[events.FieldRecordingHash].(string)
	require.NotEmpty(t, final, "session.end of %q carries a recording hash", command)
	chunks, err := recording.GetChunks(ctx, spool, sid.(string))
	require.NoError(t, err)
	_, err = recording.Verify(chunks, final)
	require.NoError(t, err)
	var cast bytes.Buffer
	require.NoError(t, recording.Export(&cast, chunks))
	h, evs, err := recording.Parse(cast.Bytes())
	require.NoError(t, err)
	return h, evs
}

func splitEvents(evs []recording.Event) (out string, marks []string) {
	var b strings.Builder
	for _, e := range evs {
		switch e.Code {
		case "o":
			b.WriteString(e.Data)
		default:
			marks = append(marks, e.Code+":"+e.Data)
		}
	}
	return b.String(), marks
}

// TestExecWithoutPTYIsRecorded: an exec without a pty is recorded: its
// stdout and stderr and its exit status, in an 80x24 header.
func TestExecWithoutPTYIsRecorded(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.dial()
	cmd := `echo to-stdout; echo to-stderr >&2; exit 4`
	out, errOut, err := run(t, c, cmd)
	var exitErr *ssh.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 4, exitErr.ExitStatus())
	require.Equal(t, "to-stdout\n", out)
	require.Equal(t, "to-stderr\n", errOut)

	h, evs := recordingOfEnd(t, ctx, spool, audit, cmd)
	require.Equal(t, uint32(80), h.Width)
	require.Equal(t, uint32(24), h.Height)
	require.Equal(t, cmd, h.Command)
	text, marks := splitEvents(evs)
	require.Contains(t, text, "to-stdout\n")
	require.Contains(t, text, "to-stderr\n")
	require.Equal(t, []string{"m:exec: " + cmd, "m:exit-status 4"}, marks)
}

// TestFileTransferMarkers: sftp and scp sessions are marked at start and
// end with the exit status; the files themselves are not recorded.
func TestFileTransferMarkers(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.dial()
	dir := t.TempDir()

	sftpRoundTrip(t, c, dir, 64<<10)
	_, evs := recordingOfEnd(t, ctx, spool, audit, "subsystem:sftp")
	text, marks := splitEvents(evs)
	require.Empty(t, text, "file contents are not recorded")
	require.Equal(t, []string{"m:sftp start", "m:sftp end", "m:exit-status 0"}, marks)

	if _, err := os.Stat("/usr/bin/scp"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no scp binary: .ci/run must install openssh-client")
		}
		t.Skip("no scp binary on this machine (apt-get install openssh-client)")
	}
	// The legacy scp protocol by hand: `scp -t DIR` receives one file.
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	cmd := "scp -t " + dir
	require.NoError(t, s.Start(cmd))
	rd := bufio.NewReader(stdout)
	ack := func() {
		b, err := rd.ReadByte()
		require.NoError(t, err)
		require.Zero(t, b, "scp acknowledges with a zero byte")
	}
	ack()
	_, err = fmt.Fprintf(stdin, "C0644 12 secret.txt\n")
	require.NoError(t, err)
	ack()
	_, err = io.WriteString(stdin, "top-secret!\n\x00")
	require.NoError(t, err)
	ack()
	require.NoError(t, stdin.Close())
	require.NoError(t, s.Wait())
	got, err := os.ReadFile(filepath.Join(dir, "secret.txt"))
	require.NoError(t, err)
	require.Equal(t, "top-secret!\n", string(got))

	_, evs = recordingOfEnd(t, ctx, spool, audit, cmd)
	text, marks = splitEvents(evs)
	require.NotContains(t, text, "top-secret", "file contents are not recorded")
	require.Equal(t, []string{"m:scp start: upload to " + dir, "m:scp end", "m:exit-status 0"}, marks)
}

// TestAgentUseIsMarked: each use of the forwarded agent by a process on
// the node puts a marker into the connection's recordings.
func TestAgentUseIsMarked(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := e.dialAs(e.me, e.signer(e.me))
	require.NoError(t, err)
	defer c.Close()
	keyring := agent.NewKeyring()
	require.NoError(t, keyring.Add(agent.AddedKey{PrivateKey: mustEd25519(t), Comment: "test-key"}))
	ac := serveAgentChannels(t, c, keyring)
	_ = ac

	s, err := c.NewSession()
	require.NoError(t, err)
	require.NoError(t, agent.RequestAgentForwarding(s))
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	cmd := `echo "sock=$SSH_AUTH_SOCK"; read x; echo used`
	require.NoError(t, s.Start(cmd))
	out := w.waitFor(t, "sock=/")
	sock := strings.TrimSpace(strings.SplitN(strings.SplitN(out, "sock=", 2)[1], "\n", 2)[0])
	listKeys(t, sock)
	_, err = stdin.Write([]byte("\n"))
	require.NoError(t, err)
	w.waitFor(t, "used")
	require.NoError(t, s.Wait())

	_, evs := recordingOfEnd(t, ctx, spool, audit, cmd)
	_, marks := splitEvents(evs)
	require.Equal(t, []string{"m:exec: " + cmd, "m:agent: forwarded agent used", "m:exit-status 0"}, marks)
}

// TestRecordingsPerChannel: several sessions on one connection (as
// OpenSSH's ControlMaster multiplexes them) each get a recording of their
// own: only their output, timestamps that never go back.
func TestRecordingsPerChannel(t *testing.T) {
	e, spool, audit := recordingEnv(t, services.ClusterNetworkingConfigSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := e.dial()
	const n = 3
	cmds := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		cmds[i] = fmt.Sprintf(`for j in 1 2 3 4 5; do echo "chan-%d-$j"; sleep 0.05; done`, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.NewSession()
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			if i%2 == 0 {
				if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
					t.Error(err)
					return
				}
			}
			if _, err := s.Output(cmds[i]); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, cmd := range cmds {
		h, evs := recordingOfEnd(t, ctx, spool, audit, cmd)
		require.False(t, seen[h.SessionID])
		seen[h.SessionID] = true
		text, _ := splitEvents(evs)
		for j := 1; j <= 5; j++ {
			require.Contains(t, text, fmt.Sprintf("chan-%d-%d", i, j))
		}
		for k := range n {
			if k != i {
				require.NotContains(t, text, fmt.Sprintf("chan-%d-", k), "recording %d holds only its own channel", i)
			}
		}
		for k := 1; k < len(evs); k++ {
			require.GreaterOrEqual(t, evs[k].Time, evs[k-1].Time, "recording %d: event %d goes back in time", i, k)
		}
		require.Greater(t, evs[len(evs)-1].Time, 0.1, "real time passed")
	}
}

// TestResizeFromInsideIsRecorded: a program that resizes its own terminal
// (`stty cols 100`) sends no window-change, yet the recording shows the
// new size before the output drawn at it; a client window-change of the
// same size is not recorded twice.
func TestResizeFromInsideIsRecorded(t *testing.T) {
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
	w := watchOutput(stdout)
	cmd := `echo before; sleep 0.2; stty cols 100; sleep 0.2; echo "after $(stty size)"; read x`
	require.NoError(t, s.Start(cmd))
	w.waitFor(t, "after 24 100")
	require.NoError(t, s.WindowChange(24, 100)) // the size it already has
	require.NoError(t, s.Close())

	_, evs := recordingOfEnd(t, ctx, spool, audit, cmd)
	var sizes []string
	sawResize := false
	for _, ev := range evs {
		switch {
		case ev.Code == "r":
			sizes = append(sizes, ev.Data)
			sawResize = true
		case ev.Code == "o" && strings.Contains(ev.Data, "after 24 100"):
			require.True(t, sawResize, "the resize comes before the output drawn at the new size")
		}
	}
	require.Equal(t, []string{"100x24"}, sizes)
}
