package sshproxy

import (
	"context"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/observe/provider"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/reversetunnel"
	"github.com/postern-dev/postern/lib/srv"
)

// The configs of the benchmark's chain, in one place: a tree from before
// the observe.Deps conversion builds the same chain with its own version
// of this file, so the "before" figure comes from the same benchmark.

type tracerProvider = oteltrace.TracerProvider

func benchArms(b *testing.B, collector string) []benchTracer {
	rate := 1.0
	tp, err := provider.New(observe.TracingConfig{Exporter: observe.ExporterOTLP, Endpoint: collector, SamplingRate: &rate}, "bench", nil)
	require.NoError(b, err)
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return []benchTracer{{name: "tracing=off"}, {name: "tracing=sampled", tp: tp}}
}

func tracer(tp tracerProvider, component string) oteltrace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(component)
}

func nodeSrvConfig(c srv.Config, clock clockwork.Clock, log logrus.FieldLogger, tp tracerProvider, component string) srv.Config {
	c.Deps = observe.Deps{Clock: clock, Logger: log, Tracer: tracer(tp, component)}
	return c
}

func tunnelServerConfig(c reversetunnel.ServerConfig, clock clockwork.Clock, log logrus.FieldLogger, tp tracerProvider) reversetunnel.ServerConfig {
	c.Deps = observe.Deps{Clock: clock, Logger: log, Tracer: tracer(tp, observe.ComponentTunnelServer)}
	return c
}

func agentConfig(c reversetunnel.AgentConfig, clock clockwork.Clock, log logrus.FieldLogger) reversetunnel.AgentConfig {
	c.Deps = observe.Deps{Clock: clock, Logger: log}
	return c
}

func routerConfig(c proxy.RouterConfig, clock clockwork.Clock, log logrus.FieldLogger, tp tracerProvider) proxy.RouterConfig {
	c.Deps = observe.Deps{Clock: clock, Logger: log, Tracer: tracer(tp, observe.ComponentRouter)}
	return c
}

func handlerConfig(c Config, log logrus.FieldLogger) Config {
	c.Deps = observe.Deps{Logger: log}
	return c
}
