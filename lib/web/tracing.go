package web

import (
	"bufio"
	"net"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// traced starts a span per request ("HTTP GET", say), the parent of the
// request's route and dial spans (a web terminal's node). A browser's
// traceparent header is not honoured: trace ids are the proxy's to pick,
// as an SSH client's are. With tracing off the span is a no-op and the
// request goes through unwrapped.
func traced(tracer oteltrace.Tracer, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), "HTTP "+r.Method, oteltrace.WithSpanKind(oteltrace.SpanKindServer))
		defer span.End()
		if !span.IsRecording() {
			next.ServeHTTP(w, r)
			return
		}
		span.SetAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path))
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

// statusWriter records the status a handler wrote. Unwrap lets
// http.ResponseController reach the connection (the terminal's
// websocket hijacks it).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack serves callers that assert http.Hijacker directly (the join
// relay).
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// Flush serves callers that assert http.Flusher directly.
func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }
