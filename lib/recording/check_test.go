package recording

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func checkAll(chunks []Chunk, wantFinal string) Check {
	var k Checker
	for _, c := range chunks {
		k.Add(c)
	}
	return k.Result(wantFinal)
}

// TestCheckerNamesWhereAndHow: the verdict says verified, incomplete or
// tampered, and for a tampered recording the first chunk that does not
// check out, how, and the prefix (bytes, time) the chain still vouches for.
func TestCheckerNamesWhereAndHow(t *testing.T) {
	chunks, final := threeChunks(t)
	var export bytes.Buffer
	require.NoError(t, Export(&export, chunks))
	first, err := DecodeChunk(chunks[0].Data)
	require.NoError(t, err)

	ok := checkAll(chunks, "")
	require.Equal(t, CheckVerified, ok.State)
	require.Equal(t, len(chunks), ok.Chunks)
	require.Equal(t, int64(export.Len()), ok.Bytes)
	require.False(t, ok.Audited)
	require.NoError(t, ok.Err())
	require.Contains(t, ok.Summary(), "verified: hash chain intact over")
	audited := checkAll(chunks, final)
	require.Equal(t, CheckVerified, audited.State)
	require.True(t, audited.Audited)
	require.Contains(t, audited.Summary(), "matching the final hash of the session.end audit event")

	flipped := append([]Chunk(nil), chunks...)
	d := append([]byte(nil), flipped[1].Data...)
	d[len(d)/2] ^= 1
	flipped[1].Data = d
	bad := checkAll(flipped, "")
	require.Equal(t, CheckTampered, bad.State)
	require.Equal(t, 1, bad.BrokenChunk)
	require.Equal(t, ProblemHashMismatch, bad.Problem)
	require.Equal(t, 1, bad.Chunks)
	require.Equal(t, int64(len(first)), bad.Bytes, "only chunk 0 is vouched for")
	require.Error(t, bad.Err())
	require.Contains(t, bad.Summary(), "NOT VERIFIED, TAMPERED: the hash chain breaks at chunk 1 (hash mismatch")

	gap := checkAll(append(append([]Chunk(nil), chunks[:2]...), chunks[3:]...), "")
	require.Equal(t, CheckTampered, gap.State)
	require.Equal(t, ProblemMissingChunk, gap.Problem)
	require.Equal(t, 2, gap.BrokenChunk)

	cut := chunks[:len(chunks)-1]
	inc := checkAll(cut, "")
	require.Equal(t, CheckIncomplete, inc.State, "no final chunk and nothing audited: incomplete, not tampered")
	require.NoError(t, inc.Err())
	require.Contains(t, inc.Summary(), "INCOMPLETE, not tampered")
	trunc := checkAll(cut, final)
	require.Equal(t, CheckTampered, trunc.State, "the audit log says there was a final chunk")
	require.Equal(t, ProblemTruncated, trunc.Problem)
	require.Equal(t, len(chunks)-1, trunc.BrokenChunk)

	require.Equal(t, ProblemRewritten, checkAll(chunks, chunks[1].Hash).Problem)
	require.Equal(t, ProblemMissingChunk, checkAll(nil, "").Problem)
}
