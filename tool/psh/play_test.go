package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
)

const playSession = "0b7c9a4e-1d2f-4a3b-8c5d-6e7f8091a2b3"

// dirSink stores a writer's chunks in a recordings directory, as the auth
// server does.
type dirSink struct {
	t  *testing.T
	st recording.DirStorage
}

func (d dirSink) WriteChunk(c recording.Chunk) error {
	return d.st.PutChunk(context.Background(), playSession, c)
}

// storedRecording records five chunks of output ("line 0" .. "line 4",
// a second apart) into a directory store and returns the store.
func storedRecording(t *testing.T) recording.DirStorage {
	st := recording.DirStorage{Dir: t.TempDir()}
	clock := clockwork.NewFakeClock()
	w, err := recording.New(recording.Config{
		Header: recording.Header{SessionID: playSession, Width: 80, Height: 24, User: "alice", Login: "root", Node: "n1", Cluster: "c"},
		Sink:   dirSink{t: t, st: st}, Deps: observe.Deps{Clock: clock}, ChunkBytes: 64,
	})
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		w.Output([]byte(fmt.Sprintf("\x1b[31mline %d\x1b[0m %s\r\n", i, strings.Repeat("x", 80))))
		clock.Advance(time.Second)
	}
	_, err = w.Close("exit-status 0")
	require.NoError(t, err)
	idx, err := st.ChunkIndexes(context.Background(), playSession)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(idx), 5, "a chunk per line")
	return st
}

func chunkPath(st recording.DirStorage, i int) string {
	return filepath.Join(st.Dir, playSession, fmt.Sprintf("%08d.chunk", i))
}

// alterOnDisk rewrites stored chunk i's events (the gzip is valid, the
// stored hash is left as it was): what someone editing the store does.
func alterOnDisk(t *testing.T, st recording.DirStorage, i int, from, to string) {
	data, err := os.ReadFile(chunkPath(st, i))
	require.NoError(t, err)
	var c recording.Chunk
	require.NoError(t, json.Unmarshal(data, &c))
	plain, err := recording.DecodeChunk(c.Data)
	require.NoError(t, err)
	require.Contains(t, string(plain), from)
	c.Data = gzipOf(t, bytes.ReplaceAll(plain, []byte(from), []byte(to)))
	data, err = json.Marshal(c)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(chunkPath(st, i), data, 0o600))
}

func gzipOf(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write(b)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// playStored runs psh play's check-and-play on the stored chunks, as
// doPlay does on what the proxy streams.
func playStored(t *testing.T, st recording.DirStorage, opts playOptions) (string, string, error) {
	chunks, err := recording.GetChunks(context.Background(), st, playSession)
	require.NoError(t, err)
	p := newCheckedPlay()
	for _, c := range chunks {
		require.NoError(t, p.add(c))
	}
	var out, errOut bytes.Buffer
	c := &cli{stdout: &out, stderr: &errOut}
	err = c.play(context.Background(), playSession, p, opts)
	return out.String(), errOut.String(), err
}

// TestPlayVerifiesFirst: psh play says on stderr, before the output, what
// it verified; a recording with a chunk altered on disk is named tampered
// at that chunk and not played without --force; with --force it is
// played, marked where the chain breaks, and still fails; a recording
// whose final chunk is gone is INCOMPLETE, played, and not a failure.
func TestPlayVerifiesFirst(t *testing.T) {
	text := playOptions{format: "text", speed: 1}
	tty := playOptions{format: "tty", speed: 1000}

	t.Run("intact", func(t *testing.T) {
		st := storedRecording(t)
		out, errOut, err := playStored(t, st, text)
		require.NoError(t, err)
		require.Regexp(t, `^psh: recording `+playSession+` verified: hash chain intact over \d+ chunks \(\d+ bytes, complete\)`, errOut)
		require.Contains(t, out, "line 4")
		require.NotContains(t, out, "NOT VERIFIED")
	})

	t.Run("tampered", func(t *testing.T) {
		st := storedRecording(t)
		alterOnDisk(t, st, 2, "line 2", "line X")
		out, errOut, err := playStored(t, st, text)
		require.Error(t, err)
		require.Contains(t, err.Error(), "FAILED verification (chunk 2: hash mismatch); not playing it (psh play --force")
		require.Empty(t, out, "nothing is played")
		require.Regexp(t, `NOT VERIFIED, TAMPERED: the hash chain breaks at chunk 2 \(hash mismatch, at byte \d+, [0-9.]+s into the session\)`, errOut)

		out, errOut, err = playStored(t, st, playOptions{format: "text", speed: 1, force: true})
		require.Error(t, err, "--force plays it but psh still fails")
		require.Contains(t, err.Error(), "played because of --force")
		require.Contains(t, errOut, "NOT VERIFIED, TAMPERED")
		before, after, ok := strings.Cut(out, "NOT VERIFIED from here on: the hash chain breaks at chunk 2 (hash mismatch)")
		require.True(t, ok, out)
		require.Contains(t, before, "line 0", "the verified part comes before the mark")
		require.Contains(t, after, "line X", "the altered output comes after it")

		out, errOut, err = playStored(t, st, playOptions{format: "tty", speed: 1000, force: true})
		require.Error(t, err)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		require.Len(t, lines, 3, errOut)
		require.Contains(t, lines[0], "NOT VERIFIED, TAMPERED")
		require.Equal(t, "psh: playback reached chunk 2 of recording "+playSession+", where the hash chain breaks (hash mismatch): what follows is NOT VERIFIED", lines[1])
		require.Equal(t, lines[0], lines[2], "said again after the replay")
		before, after, ok = strings.Cut(out, terminalReset)
		require.True(t, ok)
		require.Contains(t, before, "line 0")
		require.NotContains(t, before, "line X")
		require.Contains(t, after, "line X")

		out, _, err = playStored(t, st, playOptions{format: "asciicast", speed: 1, force: true})
		require.Error(t, err)
		_, evs, perr := recording.Parse([]byte(out))
		require.NoError(t, perr, "still an asciicast file")
		var marks []string
		for _, e := range evs {
			if e.Code == "m" {
				marks = append(marks, e.Data)
			}
		}
		require.True(t, strings.HasPrefix(marks[0], brokenMarkerPrefix), marks)
	})

	t.Run("missing chunk", func(t *testing.T) {
		st := storedRecording(t)
		require.NoError(t, os.Remove(chunkPath(st, 1)))
		_, errOut, err := playStored(t, st, tty)
		require.Error(t, err)
		require.Contains(t, errOut, "breaks at chunk 1 (missing chunk")
		require.Contains(t, errOut, "chunk 1 is missing (the next stored chunk is 2)")
	})

	t.Run("incomplete", func(t *testing.T) {
		st := storedRecording(t)
		idx, err := st.ChunkIndexes(context.Background(), playSession)
		require.NoError(t, err)
		require.NoError(t, os.Remove(chunkPath(st, idx[len(idx)-1])))
		out, errOut, err := playStored(t, st, tty)
		require.NoError(t, err, "incomplete is not tampered")
		require.Contains(t, errOut, "INCOMPLETE, not tampered: hash chain intact over")
		require.NotContains(t, errOut, "TAMPERED")
		require.Contains(t, errOut, "psh: playback reached the end of what was recorded: the recording is INCOMPLETE")
		require.Contains(t, out, "line 3")
	})
}
