package web

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// TestTracedRequests: a traced request is a server span named for its
// method with the path and status, a 5xx is an error span, the handler's
// context carries the span (what it dials joins the trace), and a handler
// that hijacks the connection (the join relay) still can.
func TestTracedRequests(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()
	var inner oteltrace.SpanContext
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		inner = oteltrace.SpanContextFromContext(r.Context())
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusBadGateway) })
	mux.HandleFunc("/hijack", func(w http.ResponseWriter, r *http.Request) {
		hj, ok := w.(http.Hijacker)
		require.True(t, ok)
		c, brw, err := hj.Hijack()
		require.NoError(t, err)
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		_ = brw.Flush()
	})
	srv := httptest.NewServer(traced(tp.Tracer("web"), mux))
	defer srv.Close()

	for _, p := range []string{"/ok", "/fail"} {
		resp, err := http.Get(srv.URL + p)
		require.NoError(t, err)
		resp.Body.Close()
	}
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("GET /hijack HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.NoError(t, err)
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 200 OK\r\n", line)

	spans := rec.Ended()
	require.GreaterOrEqual(t, len(spans), 2)
	require.Equal(t, "HTTP GET", spans[0].Name())
	require.Equal(t, spans[0].SpanContext().SpanID(), inner.SpanID())
	require.Equal(t, codes.Unset, spans[0].Status().Code)
	require.Equal(t, codes.Error, spans[1].Status().Code)
}
