package observe

import (
	"net"
	"net/url"
	"strings"

	"github.com/gravitational/trace"
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

// OTLPEndpoint is tracing.endpoint as host:port and whether it is TLS.
func (c TracingConfig) OTLPEndpoint() (hostport string, tls bool, err error) {
	return parseEndpoint(c.Endpoint)
}

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
