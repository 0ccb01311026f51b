package web

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTerminalDialJoinsRequestTrace: a web terminal's route and dial
// spans are children of the upgrade request's HTTP span, in its trace,
// though the terminal itself lives on the web session's context.
func TestTerminalDialJoinsRequestTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()
	e := newTracedTermEnv(t, tp.Tracer("web"))
	ws := e.login(t)

	ctx := testCtx(t)
	c := e.dialTerminal(t, ctx, ws, defaultParams())
	openTerminal(t, ctx, c, ws.token)
	readUntil(t, ctx, c, FrameData, "prompt$ ")
	<-e.node.started

	// The route and dial spans have ended once the session runs; the
	// HTTP span is still open (the socket is its request), so it is
	// found among the started spans.
	var httpSpan sdktrace.ReadOnlySpan
	for _, s := range rec.Started() {
		if s.Name() == "HTTP GET" && s.SpanContext().TraceID().IsValid() {
			for _, a := range s.Attributes() {
				if a.Key == "url.path" && a.Value.AsString() == "/webapi/terminal" {
					httpSpan = s
				}
			}
		}
	}
	require.NotNil(t, httpSpan, "no HTTP span for the terminal")
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	route, dial := byName["route"], byName["dial"]
	require.NotNil(t, route, "no route span")
	require.NotNil(t, dial, "no dial span")
	for _, s := range []sdktrace.ReadOnlySpan{route, dial} {
		require.Equal(t, httpSpan.SpanContext().TraceID(), s.SpanContext().TraceID(), s.Name())
		require.Equal(t, httpSpan.SpanContext().SpanID(), s.Parent().SpanID(), s.Name())
	}
}
