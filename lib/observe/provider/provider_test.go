package provider

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/postern-dev/postern/lib/observe"
)

// TestProviderExportsOTLP: with tracing on, the spans reach an OTLP/HTTP
// collector at /v1/traces on Shutdown, with the process named in the
// resource; with tracing off, nothing is started (goleak checks) and a
// span carries no context.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestProviderExportsOTLP(t *testing.T) {
	var mu sync.Mutex
	var got []*collectortrace.ExportTraceServiceRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	defer srv.Close()

	off, err := New(observe.TracingConfig{}, "p1", nil)
	require.NoError(t, err)
	_, span := off.Tracer("x").Start(context.Background(), "nothing")
	require.False(t, span.SpanContext().IsValid())
	span.End()
	require.NoError(t, off.Shutdown(context.Background()))

	rate := 1.0
	on, err := New(observe.TracingConfig{Exporter: observe.ExporterOTLP, Endpoint: strings.TrimPrefix(srv.URL, "http://"), SamplingRate: &rate}, "proxy-1", nil)
	require.NoError(t, err)
	_, span = on.Tracer(observe.ComponentRouter).Start(context.Background(), "route")
	span.End()
	require.NoError(t, on.Shutdown(context.Background()))

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1)
	rs := got[0].ResourceSpans[0]
	var instance string
	for _, kv := range rs.Resource.Attributes {
		if kv.Key == "service.instance.id" {
			instance = kv.Value.GetStringValue()
		}
	}
	require.Equal(t, "proxy-1", instance)
	require.Equal(t, observe.ComponentRouter, rs.ScopeSpans[0].Scope.Name)
	require.Equal(t, "route", rs.ScopeSpans[0].Spans[0].Name)

	_, err = New(observe.TracingConfig{Exporter: "zipkin", Endpoint: "c:1"}, "x", nil)
	require.ErrorContains(t, err, `tracing.exporter "zipkin"`)
}

// TestSDKErrorsGoToLogrus: a collector that refuses a batch is reported
// through the tracing component's logger, with the component field, not
// through Go's std log.
func TestSDKErrorsGoToLogrus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "collector says no", http.StatusBadRequest)
	}))
	defer srv.Close()

	logger, hook := logtest.NewNullLogger()
	rate := 1.0
	tp, err := New(observe.TracingConfig{Exporter: observe.ExporterOTLP, Endpoint: strings.TrimPrefix(srv.URL, "http://"), SamplingRate: &rate},
		"proxy-1", logger.WithField("component", observe.ComponentTracing))
	require.NoError(t, err)
	_, span := tp.Tracer(observe.ComponentRouter).Start(context.Background(), "route")
	span.End()
	// Shutdown exports the last batch; its error goes to the handler.
	require.NoError(t, tp.Shutdown(context.Background()))

	var found bool
	for _, e := range hook.AllEntries() {
		if e.Message == "Tracing export failed." && e.Data["component"] == observe.ComponentTracing {
			require.ErrorContains(t, e.Data[logrus.ErrorKey].(error), "400")
			found = true
		}
	}
	require.True(t, found, "entries: %v", hook.AllEntries())
}
