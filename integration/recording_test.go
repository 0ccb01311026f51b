package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/recording"
)

// TestSessionRecordedEndToEnd: a pty session through the proxy that prints
// a counter is recorded on the node, shipped to auth, verified by
// `pctl recordings verify` against the session.end hash, exported as an
// asciicast file with the counter in order, the resize and the exit
// marker; a flipped byte, a deleted middle chunk and a cut tail are each
// found.
func TestSessionRecordedEndToEnd(t *testing.T) {
	c := newAllInOne(t)
	clt, err := c.viaJump(t, c.hostname+":0")
	require.NoError(t, err)
	s, err := clt.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	const cmd = `for i in $(seq 1 25); do echo "counter $i"; [ $i = 5 ] && stty cols 100; sleep 0.1; done; exit 3`
	require.NoError(t, s.Start(cmd))
	require.NoError(t, s.WindowChange(30, 120))
	var exitErr *ssh.ExitError
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	require.ErrorAs(t, s.Wait(), &exitErr)
	require.Equal(t, 3, exitErr.ExitStatus())

	var sid, hash string
	var maxBytes any
	require.Eventually(t, func() bool {
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.SessionStart && e.Fields[events.FieldCommand] == cmd {
				sid, _ = e.Fields[events.FieldSessionID].(string)
				maxBytes = e.Fields["max_recording_bytes"]
			}
		}
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.SessionEnd && sid != "" && e.Fields[events.FieldSessionID] == sid {
				hash, _ = e.Fields[events.FieldRecordingHash].(string)
			}
		}
		if hash == "" {
			return false
		}
		ls, _, err := pctl(t, c.dataDir, "", "recordings", "ls")
		return err == nil && regexp.MustCompile(sid+`.*\btrue\b`).MatchString(ls)
	}, 30*time.Second, 100*time.Millisecond, "the recording reaches auth, complete")

	// No cap configured: the default, 256 MiB, is the one in effect on
	// the node (from auth's networking config through the node's recorder
	// to the session's writer).
	require.Equal(t, "268435456", fmt.Sprint(maxBytes), "session.start's max_recording_bytes")

	out := mustPctl(t, c.dataDir, "", "recordings", "verify", sid)
	require.Contains(t, out, "OK")
	require.Contains(t, out, "against the audited final hash")
	require.Contains(t, out, hash)

	castPath := filepath.Join(t.TempDir(), "s.cast")
	mustPctl(t, c.dataDir, "", "recordings", "export", sid, "--out", castPath)
	cast, err := os.ReadFile(castPath)
	require.NoError(t, err)
	h, evs, err := recording.Parse(cast)
	require.NoError(t, err)
	require.Equal(t, sid, h.SessionID)
	require.Equal(t, "alice", h.User)
	var text strings.Builder
	var marks []string
	for _, e := range evs {
		if e.Code == "o" {
			text.WriteString(e.Data)
		} else {
			marks = append(marks, e.Code+":"+e.Data)
		}
	}
	// Root's ~/.bashrc on these machines may print pyenv noise first
	// (NOTES.md): compare the counter lines.
	var want []string
	for i := 1; i <= 25; i++ {
		want = append(want, fmt.Sprintf("counter %d", i))
	}
	require.Equal(t, want, regexp.MustCompile(`counter \d+`).FindAllString(text.String(), -1), "every counter value, in order")
	require.Contains(t, marks, "r:120x30")
	require.Equal(t, "m:exit-status 3", marks[len(marks)-1])

	// Tampering, on copies of the auth server's store, verified offline.
	store := filepath.Join(c.dataDir, "auth", "recordings")
	idx, err := recording.DirStorage{Dir: store}.ChunkIndexes(t.Context(), sid)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(idx), 3, "a 2.5 s session closes a chunk every second")
	tampered := func(mod func(dir string)) string {
		dir := t.TempDir()
		require.NoError(t, os.CopyFS(filepath.Join(dir, sid), os.DirFS(filepath.Join(store, sid))))
		mod(filepath.Join(dir, sid))
		out, errOut, err := pctl(t, c.dataDir, "", "recordings", "verify", sid, "--dir", dir, "--hash", hash)
		require.Error(t, err, out)
		return errOut
	}
	chunkFile := func(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("%08d.chunk", i)) }
	errOut := tampered(func(dir string) {
		p := chunkFile(dir, 1)
		var ch recording.Chunk
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(data, &ch))
		ch.Data[len(ch.Data)/2] ^= 0x01
		data, err = json.Marshal(ch)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p, data, 0o600))
	})
	require.Contains(t, errOut, "chunk 1 is wrong")
	errOut = tampered(func(dir string) { require.NoError(t, os.Remove(chunkFile(dir, 1))) })
	require.Contains(t, errOut, "chunk 1 is missing")
	errOut = tampered(func(dir string) { require.NoError(t, os.Remove(chunkFile(dir, len(idx)-1))) })
	require.Contains(t, errOut, "tail is cut")

	// psh, as the owner: the listing and the text rendering, counter in
	// order, resize and exit status marked.
	alice := newPshEnv(t, c)
	alice.login(t, "alice", alicePassword+"\n")
	require.Contains(t, alice.mustRun(t, "", "recordings", "ls"), sid)
	played := alice.mustRun(t, "", "play", sid, "--format", "text")
	require.Equal(t, want, regexp.MustCompile(`counter \d+`).FindAllString(played, -1), played)
	require.Contains(t, played, "[resize")
	require.Regexp(t, `\[marker [0-9.]+s\] exit-status 3\n$`, played)
	require.Equal(t, string(cast), alice.mustRun(t, "", "play", sid, "--format", "asciicast"), "psh and pctl export the same file")

	// Another user sees nothing of it: not listed, and playing it is
	// refused like a recording that does not exist.
	mustPctl(t, c.dataDir, "bob's password!\n", "users", "add", "bob", "--logins", c.login)
	bob := newPshEnv(t, c)
	bob.login(t, "bob", "bob's password!\n")
	require.NotContains(t, bob.mustRun(t, "", "recordings", "ls"), sid)
	_, stderr, code := bob.run(t, "", "play", sid, "--format", "text")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "not found")
	_, stderrMissing, _ := bob.run(t, "", "play", "00000000-0000-4000-8000-000000000000", "--format", "text")
	require.Equal(t, strings.ReplaceAll(stderr, sid, "X"), strings.ReplaceAll(stderrMissing, "00000000-0000-4000-8000-000000000000", "X"),
		"refused and missing look the same")

	// A reviewer sees everyone's.
	role := filepath.Join(t.TempDir(), "reviewer.yaml")
	require.NoError(t, os.WriteFile(role, []byte("kind: role\nmetadata: {name: reviewer}\nspec:\n  review_recordings: true\n"), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", role)
	mustPctl(t, c.dataDir, "carol's password\n", "users", "add", "carol", "--logins", c.login, "--roles", "access,reviewer")
	carol := newPshEnv(t, c)
	carol.login(t, "carol", "carol's password\n")
	require.Contains(t, carol.mustRun(t, "", "recordings", "ls"), sid)
	require.Contains(t, carol.mustRun(t, "", "play", sid, "--format", "text"), "counter 25")
	require.Eventually(t, func() bool {
		n := 0
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.RecordingPlay && e.Fields[events.FieldSessionID] == sid {
				n++
			}
		}
		return n >= 3
	}, 10*time.Second, 100*time.Millisecond, "every playback is audited")
}
