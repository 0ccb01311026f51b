package reversetunnel

import (
	"context"
	"encoding/json"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// TestTunnelCarriesDialMeta: the proxy's trace context and connection id
// reach the node's handler on the transport's connection, on a data
// connection and in-band alike (the node's server reads them there).
func TestTunnelCarriesDialMeta(t *testing.T) {
	f := newFixture(t, nil)
	metas := make(chan observe.DialMeta, 1)
	f.startAgent(t, f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: "node-1", Role: RoleNode}), func(nc net.Conn) {
		metas <- observe.MetaOf(nc)
		_ = nc.Close()
	}, nil)
	waitTunnel(t, f.srv, "node-1")

	want := observe.DialMeta{ConnID: "conn-7", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	ctx := want.Context(context.Background())
	conn, err := f.srv.DialTunnel(ctx, "node-1", "203.0.113.7:5555", "web:22")
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, want, <-metas)
}

// TestTransportRequestMeta: a node parses a request with Meta, with a
// malformed Meta (dropped, the dial goes on), and an older proxy's
// request without it; what an older node would do with ours is the same
// lenient parse, which ignores the field.
func TestTransportRequestMeta(t *testing.T) {
	req, ok := parseTransportRequest([]byte(`{"src":"1.2.3.4:5","dst":"web:22","meta":{"conn_id":"c1","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}`))
	require.True(t, ok)
	require.Equal(t, "c1", req.Meta.ConnID)

	req, ok = parseTransportRequest([]byte(`{"src":"1.2.3.4:5","meta":{"conn_id":"c 1","traceparent":"bogus"}}`))
	require.True(t, ok)
	clean, err := req.Meta.Sanitize()
	require.ErrorContains(t, err, "conn_id")
	require.Equal(t, observe.DialMeta{}, clean)

	req, ok = parseTransportRequest([]byte(`{"src":"1.2.3.4:5","dst":"web:22"}`))
	require.True(t, ok)
	require.Nil(t, req.Meta)

	// An older node's view: its TransportRequest had no Meta.
	var old struct {
		Source string `json:"src"`
	}
	b, err := json.Marshal(TransportRequest{Source: "1.2.3.4:5", Meta: &observe.DialMeta{ConnID: "c1"}})
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &old))
	require.Equal(t, "1.2.3.4:5", old.Source)
}
