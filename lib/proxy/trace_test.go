package proxy

import (
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
