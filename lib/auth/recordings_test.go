package auth

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
)

const recSession = "5d1c2b3a-4e5f-4a6b-8c7d-9e0f1a2b3c4d"

// chunkSink collects a writer's chunks.
type chunkSink struct{ chunks []recording.Chunk }

func (s *chunkSink) WriteChunk(c recording.Chunk) error {
	s.chunks = append(s.chunks, c)
	return nil
}

func recordSession(t *testing.T, node string) ([]recording.Chunk, string) {
	sink := &chunkSink{}
	w, err := recording.New(recording.Config{
		Header: recording.Header{SessionID: recSession, User: "alice", Login: "root", Node: node, Cluster: testCluster, Width: 80, Height: 24},
		Sink:   sink, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}, ChunkBytes: 64,
	})
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		w.Output([]byte(fmt.Sprintf("line of output number %d ....................................\r\n", i)))
	}
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(sink.chunks), 3)
	return sink.chunks, final
}

// A node uploads its own session's recording over the API; another node's
// identity can neither start, extend nor rewrite it; admins read it back
// and it verifies against the final hash.
func TestRecordingUploadOnlyByItsNode(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	node1 := env.client(t, env.identity(t, "node-1", RoleNode))
	node2 := env.client(t, env.identity(t, "node-2", RoleNode))
	chunks, final := recordSession(t, "node-1")

	// node-2 claims node-1's session from the first chunk on.
	err := node2.PutRecordingChunk(ctx, recSession, chunks[0])
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	require.NoError(t, node1.PutRecordingChunk(ctx, recSession, chunks[0]))
	require.NoError(t, node1.PutRecordingChunk(ctx, recSession, chunks[0]), "an identical retry is accepted")
	err = node2.PutRecordingChunk(ctx, recSession, chunks[1])
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	// Out of order and a broken chain are refused.
	err = node1.PutRecordingChunk(ctx, recSession, chunks[2])
	require.True(t, trace.IsBadParameter(err), "%v", err)
	forged := chunks[1]
	forged.Data = chunks[2].Data
	err = node1.PutRecordingChunk(ctx, recSession, forged)
	require.ErrorContains(t, err, "hash chain")
	for _, c := range chunks[1:] {
		require.NoError(t, node1.PutRecordingChunk(ctx, recSession, c))
	}
	// Not even the recording node may rewrite a stored chunk.
	other, _ := recordSession(t, "node-1")
	other[0].Data = append([]byte(nil), chunks[1].Data...)
	err = node1.PutRecordingChunk(ctx, recSession, other[0])
	require.Error(t, err)

	admin := env.adminClient(t)
	list, err := admin.ListRecordings(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "alice", list[0].User)
	require.True(t, list[0].Complete)
	var got []recording.Chunk
	require.NoError(t, admin.GetRecording(ctx, recSession, func(c recording.Chunk) error {
		got = append(got, c)
		return nil
	}))
	_, err = recording.Verify(got, final)
	require.NoError(t, err)

	err = admin.GetRecording(ctx, "00000000-0000-4000-8000-000000000000", func(recording.Chunk) error { return nil })
	require.True(t, trace.IsNotFound(err), "%v", err)

	// From chunk N on (a player seeking), and stopped early by fn.
	var idx []int
	require.NoError(t, admin.GetRecordingFrom(ctx, recSession, 2, func(c recording.Chunk) error {
		idx = append(idx, c.Index)
		return nil
	}))
	require.Equal(t, got[2].Index, idx[0])
	require.Len(t, idx, len(got)-2)
	stop := errors.New("enough")
	n := 0
	err = admin.GetRecordingFrom(ctx, recSession, 0, func(recording.Chunk) error { n++; return stop })
	require.ErrorIs(t, err, stop)
	require.Equal(t, 1, n)
	err = admin.GetRecordingFrom(ctx, recSession, -1, func(recording.Chunk) error { return nil })
	require.True(t, trace.IsBadParameter(err), "a negative chunk is refused: %v", err)
}
