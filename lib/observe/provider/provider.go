// Package provider makes a process's OpenTelemetry tracer provider from
// the tracing section. It is apart from lib/observe so that what only
// starts spans (every component, and the clients that link lib/proxy,
// psh among them) links the OpenTelemetry API alone, not the SDK, the
// OTLP exporter and protobuf.
package provider

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/postern-dev/postern/lib/observe"
)

// Provider is a process's tracer provider: each component takes its
// Tracer from it.
type Provider struct {
	oteltrace.TracerProvider
	sdk *sdktrace.TracerProvider
}

// New returns the provider tracing config c asks for: a no-op one
// when tracing is off (no goroutine, nothing exported), else spans batched
// to the OTLP/HTTP collector. instance names this process in the spans'
// resource (service.instance.id), so that a trace shows which proxy or
// node each hop ran on. log is the tracing component's logger: the SDK's
// own errors (a collector down, a batch refused) go to it.
func New(c observe.TracingConfig, instance string, log logrus.FieldLogger) (*Provider, error) {
	if err := c.Check(); err != nil {
		return nil, trace.Wrap(err)
	}
	if !c.Enabled() {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	hostport, tls, _ := c.OTLPEndpoint()
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(hostport)}
	if !tls {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	setErrorHandler(log)
	// New does not connect: a collector that is down costs dropped
	// batches (logged through log), never a start or a dial.
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, trace.Wrap(err, "tracing.endpoint %q", c.Endpoint)
	}
	rate := 1.0
	if c.SamplingRate != nil {
		rate = *c.SamplingRate
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", "postern"),
		attribute.String("service.instance.id", instance),
	)
	sdk := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(rate))),
	)
	return &Provider{TracerProvider: sdk, sdk: sdk}, nil
}

// Shutdown exports what is buffered and stops the batcher's goroutine;
// ctx bounds the export.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return trace.Wrap(p.sdk.Shutdown(ctx))
}

// errorHandler sends the OpenTelemetry SDK's errors to logrus. The SDK
// reports them through one process-wide handler whose default is Go's std
// log: unstructured lines on stderr, without the component field, that no
// log pipeline of Postern's parses.
type errorHandler struct {
	log atomic.Pointer[logrus.FieldLogger]
}

func (h *errorHandler) Handle(err error) {
	if l := h.log.Load(); l != nil {
		(*l).WithError(err).Warn("Tracing export failed.")
	}
}

var (
	sdkErrors     errorHandler
	sdkErrorsOnce sync.Once
)

// setErrorHandler installs the handler once (the SDK's global is set-once
// in effect: its delegation is not meant to be swapped) and points it at
// log, the logger of the provider started last.
func setErrorHandler(log logrus.FieldLogger) {
	if log == nil {
		log = logrus.WithField("component", observe.ComponentTracing)
	}
	sdkErrors.log.Store(&log)
	sdkErrorsOnce.Do(func() { otel.SetErrorHandler(&sdkErrors) })
}
