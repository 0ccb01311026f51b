package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// TestDialHostSpans: a routed dial is a route span and a dial span with
// a dial.direct child, in the caller's trace; a refused route (not found,
// denied) is a route span with error status and the reason.
func TestDialHostSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("SSH-2.0-test\r\n"))
	})
	env := newRouterEnvWith(t, []services.Node{node("live", "live", ln.Addr().String(), 0)}, func(c *RouterConfig) {
		c.Tracer = tp.Tracer("router")
	})

	ctx, parent := tp.Tracer("test").Start(context.Background(), "ssh.channel")
	conn, _, err := env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "live"}})
	require.NoError(t, err)
	_, _ = io.ReadAll(conn)
	conn.Close()
	_, _, err = env.router.DialHost(ctx, RouteRequest{Target: Target{Host: "nosuch"}})
	require.True(t, trace.IsNotFound(err))
	parent.End()

	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID(), s.Name())
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	require.Len(t, byName["route"], 2)
	require.Len(t, byName["dial"], 1)
	require.Len(t, byName["dial.direct"], 1)
	require.Equal(t, byName["dial"][0].SpanContext().SpanID(), byName["dial.direct"][0].Parent().SpanID())
	require.Equal(t, codes.Unset, byName["route"][0].Status().Code)
	refused := byName["route"][1]
	require.Equal(t, codes.Error, refused.Status().Code)
	require.Contains(t, refused.Status().Description, `"nosuch"`)
}

// metaPipe is a transport connection that arrived with dial metadata, as
// a leaf's agent hands one to LeafTransport.
type metaPipe struct {
	net.Conn
	meta observe.DialMeta
}

func (c metaPipe) DialMeta() observe.DialMeta { return c.meta }

// TestLeafTransportContinuesTrace: a root proxy's request continues the
// root's trace in the leaf (leaf.serve is a child of the root's dial,
// and the leaf's own route span a child of that); a refused route in the
// leaf is an error span there.
func TestLeafTransportContinuesTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()
	env := newRouterEnvWith(t, nil, func(c *RouterConfig) { c.Tracer = tp.Tracer("leaf-router") })
	h, err := NewLeafTransport(LeafTransportConfig{
		Router: env.router,
		Identify: func(_ context.Context, cert *ssh.Certificate) (*authz.Identity, error) {
			return &authz.Identity{User: cert.KeyId, Cluster: "root", Cert: cert}, nil
		},
		Deps: observe.Deps{Tracer: tp.Tracer("leaf")},
	})
	require.NoError(t, err)

	rctx, rootDial := tp.Tracer("root").Start(observe.WithConnID(context.Background(), "root-conn"), "dial")
	meta := observe.MetaFromContext(rctx)
	rootDial.End()
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() { defer close(done); h.Serve(context.Background(), metaPipe{Conn: server, meta: meta}) }()
	_, _ = io.WriteString(client, leafRequest(t, "nosuch:22", rootUserCert(t, "alice"))+"\n")
	line, err := bufio.NewReader(client).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "not_found")
	client.Close()
	<-done

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	serve, route := byName["leaf.serve"], byName["route"]
	require.NotNil(t, serve)
	require.NotNil(t, route)
	require.Equal(t, rootDial.SpanContext().TraceID(), serve.SpanContext().TraceID())
	require.Equal(t, rootDial.SpanContext().SpanID(), serve.Parent().SpanID())
	require.Equal(t, serve.SpanContext().SpanID(), route.Parent().SpanID())
	require.Equal(t, codes.Error, route.Status().Code)
	require.Contains(t, route.Status().Description, `"nosuch"`)
}
