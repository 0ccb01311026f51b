package observe

import (
	"context"
	"net"
	"net/url"
	"strings"

	"github.com/gravitational/trace"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracingConfig is the tracing section of postern.yaml. The zero value is
// tracing off.
type TracingConfig struct {
	// Exporter: "" (off) or ExporterOTLP.
	Exporter string `yaml:"exporter,omitempty"`
	// Endpoint of the OTLP/HTTP collector: HOST:PORT (plain HTTP) or
	// https://HOST:PORT (TLS, the system's roots); spans are POSTed to
	// /v1/traces there.
	Endpoint string `yaml:"endpoint,omitempty"`
	// SamplingRate is the share of connections traced, 0..1; nil means
	// 1. A hop that receives a trace context follows its sender's
	// decision, so a trace is whole or absent.
	SamplingRate *float64 `yaml:"sampling_rate,omitempty"`
}

// ExporterOTLP is OTLP over HTTP (protobuf), the one exporter.
const ExporterOTLP = "otlp"

// Check validates the section, naming the key at fault.
func (c TracingConfig) Check() error {
	switch c.Exporter {
	case "":
		if c.Endpoint != "" || c.SamplingRate != nil {
			return trace.BadParameter("tracing.endpoint and tracing.sampling_rate need tracing.exporter: otlp")
		}
		return nil
	case ExporterOTLP:
	default:
		return trace.BadParameter("tracing.exporter %q: want otlp", c.Exporter)
	}
	if _, _, err := parseEndpoint(c.Endpoint); err != nil {
		return trace.Wrap(err)
	}
	if r := c.SamplingRate; r != nil && !(*r >= 0 && *r <= 1) {
		return trace.BadParameter("tracing.sampling_rate %v: want a number from 0 to 1", *r)
	}
	return nil
}

// Enabled reports whether spans are exported.
func (c TracingConfig) Enabled() bool { return c.Exporter != "" }

// parseEndpoint splits tracing.endpoint into host:port and whether it
// is TLS.
func parseEndpoint(ep string) (hostport string, tls bool, err error) {
	if ep == "" {
		return "", false, trace.BadParameter("tracing.endpoint is required with tracing.exporter: otlp (HOST:PORT or https://HOST:PORT)")
	}
	hostport = ep
	if strings.Contains(ep, "://") {
		u, perr := url.Parse(ep)
		if perr != nil {
			return "", false, trace.BadParameter("tracing.endpoint %q: %v", ep, perr)
		}
		switch u.Scheme {
		case "https":
			tls = true
		case "http":
		default:
			return "", false, trace.BadParameter("tracing.endpoint %q: scheme %q, want https:// or none", ep, u.Scheme)
		}
		if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
			return "", false, trace.BadParameter("tracing.endpoint %q: give HOST:PORT only (spans go to /v1/traces)", ep)
		}
		hostport = u.Host
	}
	host, port, serr := net.SplitHostPort(hostport)
	if serr != nil || host == "" || port == "" {
		return "", false, trace.BadParameter("tracing.endpoint %q: want HOST:PORT or https://HOST:PORT", ep)
	}
	return hostport, tls, nil
}

// Provider is a process's tracer provider: each component takes its
// Tracer from it.
type Provider struct {
	oteltrace.TracerProvider
	sdk *sdktrace.TracerProvider
}

// NewProvider returns the provider tracing config c asks for: a no-op one
// when tracing is off (no goroutine, nothing exported), else spans batched
// to the OTLP/HTTP collector. instance names this process in the spans'
// resource (service.instance.id), so that a trace shows which proxy or
// node each hop ran on.
func NewProvider(c TracingConfig, instance string) (*Provider, error) {
	if err := c.Check(); err != nil {
		return nil, trace.Wrap(err)
	}
	if !c.Enabled() {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	hostport, tls, _ := parseEndpoint(c.Endpoint)
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(hostport)}
	if !tls {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	// New does not connect: a collector that is down costs dropped
	// batches (logged by the SDK), never a start or a dial.
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
