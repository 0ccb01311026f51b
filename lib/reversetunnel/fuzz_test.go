package reversetunnel

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseTransportRequest: whatever a proxy sends as a transport's
// extra data, the node parses it or refuses it, never panics, and
// sanitized metadata always passes its own check. Seeds live in
// testdata/fuzz/FuzzParseTransportRequest.
func FuzzParseTransportRequest(f *testing.F) {
	f.Add([]byte(`{"src":"1.2.3.4:5","dst":"web:22","meta":{"conn_id":"c1","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}`))
	f.Add([]byte(`{"src":"1.2.3.4:5","dst":"web:22"}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, ok := parseTransportRequest(data)
		if !ok {
			return
		}
		if req.Meta != nil {
			clean, _ := req.Meta.Sanitize()
			require.NoError(t, clean.Check())
		}
		_, err := json.Marshal(req)
		require.NoError(t, err)
	})
}
