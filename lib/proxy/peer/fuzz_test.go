package peer

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseDialRequest: whatever a peer sends first, the parser returns a
// valid request or an error, never panics, never reads past the frame it
// announced, and what it accepts survives a round trip. Seeds live in
// testdata/fuzz/FuzzParseDialRequest.
func FuzzParseDialRequest(f *testing.F) {
	var good bytes.Buffer
	require.NoError(f, writeFrame(&good, DialRequest{NodeUUID: "n1", Source: "198.51.100.1:4000", Destination: "web:22"}))
	f.Add(good.Bytes())
	f.Add([]byte{0, 0})
	f.Add([]byte{0xff, 0xff, '{'})
	f.Add(append([]byte{0, 2}, "{}"...))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		req, err := ParseDialRequest(r)
		if err != nil {
			return
		}
		require.NoError(t, req.Check())
		consumed := len(data) - r.Len()
		require.LessOrEqual(t, consumed, 2+maxFrame)
		var again bytes.Buffer
		require.NoError(t, writeFrame(&again, req))
		back, err := ParseDialRequest(&again)
		require.NoError(t, err)
		require.Equal(t, req, back)
	})
}
