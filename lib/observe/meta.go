package observe

import (
	"context"
	"net"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// DialMeta rides in every dial envelope (the tunnel's TransportRequest,
// the peer DialRequest, and so the leaf request that travels in a
// tunnel transport): the W3C trace context of the hop that dials, so the
// next hop's spans join the same trace, and the connection id the first
// proxy minted, so every hop logs and audits the user's connection under
// one conn_id.
//
// Each field is optional: an old sender sends none, and tracing off sends
// no trace context. A receiver that cannot use a field (malformed,
// hostile) drops that field and dials anyway (Sanitize).
type DialMeta struct {
	// ConnID is the id of the user's connection at the first proxy.
	ConnID string `json:"conn_id,omitempty"`
	// TraceParent is the W3C traceparent header value.
	TraceParent string `json:"traceparent,omitempty"`
	// TraceState is the W3C tracestate header value.
	TraceState string `json:"tracestate,omitempty"`
}

// Field bounds. traceparent is fixed-size (55 bytes for version 00);
// tracestate is at most 32 list members of at most 256 bytes by the W3C
// spec, far more than anyone sends: 512 bytes keeps an envelope small.
const (
	maxConnID     = 64
	maxTraceParnt = 55
	maxTraceState = 512
)

// The checks are byte loops rather than regular expressions: a node runs
// them on every transport, and a regexp match was a visible share of a
// connection set-up's CPU.

func isConnID(s string) bool {
	if s == "" || len(s) > maxConnID {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// isTraceParent checks the W3C form VV-TRACEID-SPANID-FLAGS: 2, 32, 16
// and 2 lowercase hex digits.
func isTraceParent(s string) bool {
	if len(s) != maxTraceParnt || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if i == 2 || i == 35 || i == 52 {
			continue
		}
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Check reports the first field that is not well formed, by name.
func (m DialMeta) Check() error {
	if m.ConnID != "" && !isConnID(m.ConnID) {
		return trace.BadParameter("dial metadata: conn_id is not an id (1..%d of [A-Za-z0-9._-])", maxConnID)
	}
	if m.TraceParent != "" && !isTraceParent(m.TraceParent) {
		return trace.BadParameter("dial metadata: traceparent %q is not a W3C traceparent (VV-TRACEID-SPANID-FLAGS in lowercase hex)", truncate(m.TraceParent))
	}
	if len(m.TraceState) > maxTraceState || !isPrintableASCII(m.TraceState) {
		return trace.BadParameter("dial metadata: tracestate is longer than %d bytes or not printable ASCII", maxTraceState)
	}
	return nil
}

// Sanitize returns m without its malformed fields and the error naming
// them (nil when m was fine): bad metadata costs the trace or the id,
// never the dial.
func (m DialMeta) Sanitize() (DialMeta, error) {
	err := m.Check()
	if err == nil {
		return m, nil
	}
	if (DialMeta{ConnID: m.ConnID}).Check() != nil {
		m.ConnID = ""
	}
	if (DialMeta{TraceParent: m.TraceParent, TraceState: m.TraceState}).Check() != nil {
		m.TraceParent, m.TraceState = "", ""
	}
	return m, err
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// propagator is W3C trace context only: baggage is not carried (it would
// be the user's data on another operator's collector).
var propagator = propagation.TraceContext{}

// MetaFromContext is the metadata a hop sends for a dial made in ctx: its
// connection id and the trace context of its current span (none when the
// span is not recording a sampled trace, as when tracing is off).
func MetaFromContext(ctx context.Context) DialMeta {
	m := DialMeta{ConnID: ConnID(ctx)}
	if oteltrace.SpanContextFromContext(ctx).IsValid() {
		carrier := propagation.MapCarrier{}
		propagator.Inject(ctx, carrier)
		m.TraceParent = carrier["traceparent"]
		m.TraceState = carrier["tracestate"]
	}
	return m
}

// Context returns ctx with m's connection id and, as the remote parent of
// the spans started in it, m's trace context. Call it on sanitized
// metadata.
func (m DialMeta) Context(ctx context.Context) context.Context {
	if m.ConnID != "" {
		ctx = WithConnID(ctx, m.ConnID)
	}
	if m.TraceParent != "" {
		ctx = propagator.Extract(ctx, propagation.MapCarrier{"traceparent": m.TraceParent, "tracestate": m.TraceState})
	}
	return ctx
}

type connIDKey struct{}

// WithConnID returns ctx carrying a connection id.
func WithConnID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, connIDKey{}, id)
}

// ConnID is the connection id ctx carries, or "".
func ConnID(ctx context.Context) string {
	id, _ := ctx.Value(connIDKey{}).(string)
	return id
}

// NewConnID mints a connection id (the first hop's).
func NewConnID() string { return uuid.NewString() }

// LogFields are the trace_id and conn_id of ctx, for a log line: only
// those it has.
func LogFields(ctx context.Context) logrus.Fields {
	return AddLogFields(ctx, logrus.Fields{})
}

// AddLogFields adds ctx's trace_id and conn_id to f (a log line's own
// fields, so that no second map is made) and returns it.
func AddLogFields(ctx context.Context, f logrus.Fields) logrus.Fields {
	if id := ConnID(ctx); id != "" {
		f["conn_id"] = id
	}
	if sc := oteltrace.SpanContextFromContext(ctx); sc.IsValid() {
		f["trace_id"] = sc.TraceID().String()
	}
	return f
}

// MetaConn is a connection that arrived with dial metadata (a tunnel
// transport on a node): the server that handles it continues the trace
// and keeps the connection id.
type MetaConn interface {
	net.Conn
	DialMeta() DialMeta
}

// MetaOf is nc's dial metadata, or none.
func MetaOf(nc net.Conn) DialMeta {
	if mc, ok := nc.(MetaConn); ok {
		return mc.DialMeta()
	}
	return DialMeta{}
}

// End ends span, marked failed with err's message as the reason when err
// is not nil. Nothing is formatted for a span that is not recording
// (tracing off, or not sampled).
func End(span oteltrace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
