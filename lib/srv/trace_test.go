package srv

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
)

// metaConn is a connection that came over a tunnel with dial metadata.
type metaConn struct {
	net.Conn
	meta observe.DialMeta
}

func (c metaConn) DialMeta() observe.DialMeta { return c.meta }

// TestConnContinuesTrace: a connection handed over with the dialing
// proxy's metadata keeps the proxy's conn_id (in its log lines) and
// continues its trace: ssh.accept is a child of the proxy's span, with
// ssh.auth and ssh.session under it, and the log lines carry trace_id. A
// failed handshake is an error auth span.
func TestConnContinuesTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()
	e := newTestEnvTB(t, func(c *Config) { c.Tracer = tp.Tracer("node") })

	pctx, proxySpan := tp.Tracer("proxy").Start(observe.WithConnID(context.Background(), "proxy-conn-1"), "dial.tunnel")
	meta := observe.MetaFromContext(pctx)
	proxySpan.End()

	client, server := tcpPair(t)
	served := make(chan struct{})
	go func() { defer close(served); e.srv.HandleConn(metaConn{Conn: server, meta: meta}) }()
	conn, chans, reqs, err := ssh.NewClientConn(client, "node1:22", e.clientConfig(e.me, e.signer(e.me)))
	require.NoError(t, err)
	c := ssh.NewClient(conn, chans, reqs)
	out, _, err := run(t, c, "echo traced")
	require.NoError(t, err)
	require.Equal(t, "traced\n", out)
	require.NoError(t, c.Close())
	<-served
	e.requireLog("Connection ended.", "conn_id=proxy-conn-1", "trace_id="+proxySpan.SpanContext().TraceID().String())

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	accept := byName["ssh.accept"]
	require.NotNil(t, accept)
	require.Equal(t, proxySpan.SpanContext().SpanID(), accept.Parent().SpanID())
	require.Equal(t, accept.SpanContext().SpanID(), byName["ssh.auth"].Parent().SpanID())
	require.Equal(t, accept.SpanContext().SpanID(), byName["ssh.session"].Parent().SpanID())

	// A client the server refuses: the auth span says why.
	client, server = tcpPair(t)
	served = make(chan struct{})
	go func() { defer close(served); e.srv.HandleConn(server) }()
	_, _, _, err = ssh.NewClientConn(client, "node1:22", e.clientConfig("nobody-here", e.signer(e.me)))
	require.Error(t, err)
	client.Close()
	<-served
	var failed sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "ssh.auth" && s.Status().Code == codes.Error {
			failed = s
		}
	}
	require.NotNil(t, failed)
	require.NotEmpty(t, failed.Status().Description)
}

// tcpPair is a connected loopback pair (net.Pipe would deadlock: both SSH
// ends write their version first).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}
