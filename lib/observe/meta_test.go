package observe

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDialMetaCarriesTraceAndConnID: what one hop sends, the next turns
// back into a context whose spans are children of the sender's span, in
// the same trace, with the same conn_id; tracing off sends no trace
// context but still the conn_id.
func TestDialMetaCarriesTraceAndConnID(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })

	ctx := WithConnID(context.Background(), "c0ffee-1")
	ctx, span := tp.Tracer("proxy").Start(ctx, "dial")
	meta := MetaFromContext(ctx)
	require.Equal(t, "c0ffee-1", meta.ConnID)
	require.Len(t, meta.TraceParent, 55)
	require.NoError(t, meta.Check())

	// Over the wire and back, as an envelope field.
	b, err := json.Marshal(meta)
	require.NoError(t, err)
	var got DialMeta
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, meta, got)

	rctx := got.Context(context.Background())
	require.Equal(t, "c0ffee-1", ConnID(rctx))
	_, child := tp.Tracer("node").Start(rctx, "accept")
	child.End()
	span.End()
	spans := rec.Ended()
	require.Len(t, spans, 2)
	require.Equal(t, spans[1].SpanContext().TraceID(), spans[0].SpanContext().TraceID())
	require.Equal(t, spans[1].SpanContext().SpanID(), spans[0].Parent().SpanID())
	require.True(t, spans[0].Parent().IsRemote())

	f := LogFields(rctx)
	require.Equal(t, "c0ffee-1", f["conn_id"])
	require.Equal(t, spans[1].SpanContext().TraceID().String(), f["trace_id"])

	// Tracing off: the no-op tracer's spans carry no context.
	d := Deps{}
	d.SetDefaults(ComponentRouter)
	octx, ospan := d.Tracer.Start(WithConnID(context.Background(), "c2"), "dial")
	defer ospan.End()
	require.False(t, oteltrace.SpanContextFromContext(octx).IsValid())
	require.Equal(t, DialMeta{ConnID: "c2"}, MetaFromContext(octx))
}

// TestDialMetaSanitize: a malformed field is named and dropped, the rest
// kept; the dial goes on.
func TestDialMetaSanitize(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		in   DialMeta
		want DialMeta
		err  string
	}{
		{DialMeta{ConnID: "a-b.c_1", TraceParent: tp, TraceState: "k=v"}, DialMeta{ConnID: "a-b.c_1", TraceParent: tp, TraceState: "k=v"}, ""},
		{DialMeta{ConnID: "id", TraceParent: "00-xyz"}, DialMeta{ConnID: "id"}, `traceparent "00-xyz" is not a W3C traceparent`},
		{DialMeta{ConnID: "id", TraceParent: "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"}, DialMeta{ConnID: "id"}, "traceparent"},
		{DialMeta{ConnID: "bad id\n", TraceParent: tp}, DialMeta{TraceParent: tp}, "conn_id is not an id"},
		{DialMeta{ConnID: string(make([]byte, 65)), TraceParent: tp}, DialMeta{TraceParent: tp}, "conn_id"},
		{DialMeta{ConnID: "id", TraceParent: tp, TraceState: "k=\x00"}, DialMeta{ConnID: "id"}, "tracestate"},
	} {
		got, err := tc.in.Sanitize()
		require.Equal(t, tc.want, got, "%+v", tc.in)
		if tc.err == "" {
			require.NoError(t, err)
			continue
		}
		require.ErrorContains(t, err, tc.err)
		require.NoError(t, got.Check())
	}
	// A well-formed traceparent whose ids are all zero is no parent: the
	// receiver starts a trace of its own.
	ctx := DialMeta{TraceParent: "00-00000000000000000000000000000000-0000000000000000-01"}.Context(context.Background())
	require.False(t, oteltrace.SpanContextFromContext(ctx).IsValid())
}

// FuzzDialMetaJSON: whatever JSON a hop receives as dial metadata,
// Sanitize leaves only fields that pass Check, and Context never panics.
// Seeds live in testdata/fuzz/FuzzDialMetaJSON.
func FuzzDialMetaJSON(f *testing.F) {
	f.Add([]byte(`{"conn_id":"x","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"a=b"}`))
	f.Add([]byte(`{"traceparent":"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`))
	f.Add([]byte(`{"conn_id":"\u0000"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m DialMeta
		if json.Unmarshal(data, &m) != nil {
			return
		}
		clean, err := m.Sanitize()
		require.NoError(t, clean.Check())
		if err == nil {
			require.Equal(t, m, clean)
		}
		_ = clean.Context(context.Background())
	})
}
