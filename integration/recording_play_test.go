package integration

import (
	"bytes"
	"compress/gzip"
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

// TestPshPlayVerifiesTheChain: the attack is editing the auth server's
// recordings store. psh play, the real binary through the proxy, says
// "verified" for the recording as recorded; after one stored chunk's
// events are rewritten on disk it says NOT VERIFIED, TAMPERED at that
// chunk, plays nothing and exits 1; --force plays it with the break
// marked and still exits 1; with the final chunk deleted instead it says
// INCOMPLETE and exits 0.
func TestPshPlayVerifiesTheChain(t *testing.T) {
	c := newAllInOne(t)
	clt, err := c.viaJump(t, c.hostname+":0")
	require.NoError(t, err)
	s, err := clt.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	const cmd = `for i in $(seq 1 25); do echo "tick $i"; sleep 0.1; done`
	require.NoError(t, s.Start(cmd))
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	require.NoError(t, s.Wait())

	var sid string
	require.Eventually(t, func() bool {
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.SessionStart && e.Fields[events.FieldCommand] == cmd {
				sid, _ = e.Fields[events.FieldSessionID].(string)
			}
		}
		if sid == "" {
			return false
		}
		ls, _, err := pctl(t, c.dataDir, "", "recordings", "ls")
		return err == nil && regexp.MustCompile(sid+`.*\btrue\b`).MatchString(ls)
	}, 30*time.Second, 100*time.Millisecond, "the recording reaches auth, complete")

	alice := newPshEnv(t, c)
	alice.login(t, "alice", alicePassword+"\n")
	out, errOut, code := alice.run(t, "", "play", sid, "--format", "text")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `psh: recording `+sid+` verified: hash chain intact over \d+ chunks \(\d+ bytes, complete\)`, errOut)
	require.Contains(t, out, "tick 25")

	dir := filepath.Join(c.dataDir, "auth", "recordings", sid)
	idx, err := recording.DirStorage{Dir: filepath.Dir(dir)}.ChunkIndexes(t.Context(), sid)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(idx), 3, "a 2.5 s session closes a chunk every second")
	chunkFile := func(i int) string { return filepath.Join(dir, fmt.Sprintf("%08d.chunk", i)) }
	original, err := os.ReadFile(chunkFile(1))
	require.NoError(t, err)

	// Rewrite chunk 1's events, a valid gzip of valid lines, its stored
	// hash left alone.
	var ch recording.Chunk
	require.NoError(t, json.Unmarshal(original, &ch))
	plain, err := recording.DecodeChunk(ch.Data)
	require.NoError(t, err)
	forged := regexp.MustCompile(`tick (\d+)`).ReplaceAll(plain, []byte("forged $1"))
	require.NotEqual(t, plain, forged, "chunk 1 holds ticks")
	ch.Data = gzipBytes(t, forged)
	data, err := json.Marshal(ch)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(chunkFile(1), data, 0o600))

	out, errOut, code = alice.run(t, "", "play", sid, "--format", "text")
	require.Equal(t, 1, code, errOut)
	require.Empty(t, out, "a tampered recording is not played")
	require.Regexp(t, `psh: recording `+sid+` NOT VERIFIED, TAMPERED: the hash chain breaks at chunk 1 \(hash mismatch, at byte \d+`, errOut)
	require.Contains(t, errOut, "psh play --force")

	out, errOut, code = alice.run(t, "", "play", sid, "--format", "text", "--force")
	require.Equal(t, 1, code, "--force plays it, psh still fails: %s", errOut)
	mark := strings.Index(out, "NOT VERIFIED from here on: the hash chain breaks at chunk 1 (hash mismatch)")
	require.GreaterOrEqual(t, mark, 0, out)
	require.Greater(t, strings.Index(out, "forged 1"), mark, "the altered output follows the mark: %s", out)
	require.Contains(t, errOut, "played because of --force")

	// Restored, then the final chunk deleted: incomplete, not tampered.
	require.NoError(t, os.WriteFile(chunkFile(1), original, 0o600))
	require.NoError(t, os.Remove(chunkFile(idx[len(idx)-1])))
	out, errOut, code = alice.run(t, "", "play", sid, "--format", "text")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "INCOMPLETE, not tampered")
	require.NotContains(t, errOut, "TAMPERED")
	require.Contains(t, out, recording.IncompleteMarker)
}

func gzipBytes(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write(b)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}
