package peer

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// TestPeerDialCarriesMeta: the dialing proxy's trace context and
// connection id reach the peer, whose peer.serve span is a child of the
// dialing span in the same trace, and whose tunnel dial is made under the
// same conn_id (what the node will log).
func TestPeerDialCarriesMeta(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()

	env := newPeerEnv(t, "proxy-a", "n1")
	env.srv.cfg.Tracer = tp.Tracer(observe.ComponentPeerServer)
	c, _ := env.client(t, env.ca.identity(t, "proxy-b", RoleProxy), lease("n1", "proxy-a", env.addr))

	ctx, span := tp.Tracer("test").Start(observe.WithConnID(context.Background(), "conn-1"), "dial.peer")
	conn, err := c.DialPeer(ctx, "proxy-a", "n1", "198.51.100.7:5000", "web:22")
	require.NoError(t, err)
	span.End()
	readBanner(t, conn)
	require.NoError(t, conn.Close())

	env.tunnels.mu.Lock()
	got := env.tunnels.lastMeta
	env.tunnels.mu.Unlock()
	require.Equal(t, "conn-1", got.ConnID)
	require.NotEmpty(t, got.TraceParent)

	serve := waitSpan(t, rec, "peer.serve")
	require.Equal(t, span.SpanContext().TraceID(), serve.SpanContext().TraceID())
	require.Equal(t, span.SpanContext().SpanID(), serve.Parent().SpanID())
}

// TestPeerDialOldPeer: a peer of the version before dial metadata (no
// ALPN, strict decoding of a DialRequest without Meta) still serves our
// dials: Meta is only sent to a peer that negotiated ALPNv2.
func TestPeerDialOldPeer(t *testing.T) {
	ca := newTestCA(t)
	cert := ca.issue(t, "proxy-old", RoleProxy, testCluster)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13,
	})
	require.NoError(t, err)
	type v1Request struct {
		NodeUUID    string `json:"node_uuid"`
		Source      string `json:"source,omitempty"`
		Destination string `json:"destination,omitempty"`
	}
	served := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer nc.Close()
		sess, err := yamux.Server(nc, yamuxConfig())
		if err != nil {
			served <- err
			return
		}
		defer sess.Close()
		st, err := sess.AcceptStream()
		if err != nil {
			served <- err
			return
		}
		defer st.Close()
		var req v1Request
		if err := readFrame(st, &req); err != nil {
			_ = writeFrame(st, responseFor(err))
			served <- err
			return
		}
		served <- writeFrame(st, DialResponse{})
		_, _ = st.Write([]byte("SSH-2.0-old\r\n"))
		// Hold the session until the client is done: closing it right
		// after the write can reset the stream before the client has
		// read the answer.
		_, _ = io.Copy(io.Discard, st)
	}()
	defer ln.Close()

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()
	ctx, span := tp.Tracer("test").Start(observe.WithConnID(context.Background(), "conn-2"), "dial.peer")
	defer span.End()
	c, err := NewClient(ClientConfig{Identity: ca.identity(t, "proxy-b", RoleProxy), Locator: &staticLocator{leases: []services.TunnelConnection{lease("n1", "proxy-old", ln.Addr().String())}}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	conn, err := c.DialPeer(ctx, "proxy-old", "n1", "198.51.100.7:5000", "web:22")
	require.NoError(t, err)
	require.NoError(t, <-served)
	readBanner(t, conn)
	require.NoError(t, conn.Close())
}

func readBanner(t *testing.T, conn net.Conn) {
	t.Helper()
	buf := make([]byte, 8)
	_, err := io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.Equal(t, "SSH-2.0-", string(buf))
}

func waitSpan(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == name {
				found = s
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "no span %q", name)
	return found
}
