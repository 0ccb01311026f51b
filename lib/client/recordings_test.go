package client

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/recording"
)

// chunkProxy answers one recording-chunks subsystem request: accepted,
// then lines (each a JSON chunk), then stderr and the exit status.
func chunkProxy(t *testing.T, accept bool, chunks []recording.Chunk, stderr string, status uint32) *ssh.Client {
	return startTestProxy(t, func(p *testProxy, nch ssh.NewChannel) {
		ch, reqs, err := nch.Accept()
		if err != nil {
			return
		}
		defer ch.Close()
		req := <-reqs
		if !accept {
			_, _ = ch.Stderr().Write([]byte(stderr))
			_ = req.Reply(false, nil)
			return
		}
		_ = req.Reply(true, nil)
		go ssh.DiscardRequests(reqs)
		for _, c := range chunks {
			line, _ := json.Marshal(c)
			_, _ = ch.Write(append(line, '\n'))
		}
		if stderr != "" {
			_, _ = ch.Stderr().Write([]byte(stderr))
		}
		_ = ch.CloseWrite()
		_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{status}))
	})
}

// TestFetchRecordingChunks: the chunks come through as the proxy stored
// them; a stream the proxy ends with a failure is an error naming its
// reason (never a short recording, which psh would call incomplete); an
// older proxy's refusal of the subsystem is told apart.
func TestFetchRecordingChunks(t *testing.T) {
	const id = "0b7c9a4e-1d2f-4a3b-8c5d-6e7f8091a2b3"
	chunks := []recording.Chunk{{Index: 0, Hash: "aa", Data: []byte{1, 2}}, {Index: 1, Hash: "bb", Final: true, Data: []byte{3}}}
	collect := func(clt *ssh.Client) ([]recording.Chunk, error) {
		var got []recording.Chunk
		err := within(t, func() error {
			return fetchRecordingChunks(context.Background(), clt, id, func(c recording.Chunk) error {
				got = append(got, c)
				return nil
			})
		})
		return got, err
	}

	got, err := collect(chunkProxy(t, true, chunks, "", 0))
	require.NoError(t, err)
	require.Equal(t, chunks, got)

	got, err = collect(chunkProxy(t, true, chunks[:1], "postern: chunk 1 of "+id+" is unreadable\r\n", 1))
	require.Error(t, err)
	require.Len(t, got, 1)
	require.Contains(t, err.Error(), "stopped after 1 chunks: chunk 1 of "+id+" is unreadable")
	require.False(t, ChunksUnsupported(err))

	_, err = collect(chunkProxy(t, false, nil, "postern: invalid proxy subsystem request \"recording-chunks:"+id+"\": expected proxy:host:port[@cluster]\r\n", 1))
	require.Error(t, err)
	require.True(t, ChunksUnsupported(err), "%v", err)
}
