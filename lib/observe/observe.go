// Package observe holds the cross-cutting dependencies every component
// of the connection path takes (clock, logger, tracer, metrics registry,
// audit sink), the one function that defaults them, the fixed list of
// component names their logs and spans carry, and the dial metadata that
// carries a connection's trace context and id from hop to hop.
//
// Why one struct: each component used to default these fields on its own,
// with names that drifted ("proxy:router", "reversetunnel:server",
// "proxy:peer" for two different things); a new cross-cutting field (the
// tracer) would have been a fortieth copy of the same five lines. A
// component config embeds Deps and calls Deps.SetDefaults with its
// constant; zero fields mean the same thing everywhere.
package observe

import (
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/postern-dev/postern/lib/events"
)

// Component names: the "component" field of a component's logs and the
// instrumentation scope of its spans. Fixed here so that a grep of the
// logs or a trace query uses one spelling.
const (
	ComponentRouter       = "proxy:router"
	ComponentLeaf         = "proxy:leaf"
	ComponentProxySSH     = "proxy:ssh"
	ComponentPeerServer   = "proxy:peer:server"
	ComponentPeerClient   = "proxy:peer:client"
	ComponentPeerLeases   = "proxy:leases"
	ComponentTunnelServer = "reversetunnel:server"
	ComponentTunnelAgent  = "reversetunnel:agent"
	ComponentTunnelLeaves = "reversetunnel:leaves"
	ComponentHealth       = "proxy:health"
	ComponentLimiter      = "limiter"
	ComponentNode         = "node"
	ComponentWeb          = "web"
	ComponentAuthAPI      = "auth:api"
	ComponentTracing      = "tracing"
	ComponentAuth         = "auth"
	ComponentAuthClient   = "auth:client"
	ComponentHeartbeat    = "heartbeat"
	ComponentRecording    = "recording"
	ComponentRetention    = "recording:retention"
	ComponentRecordingS3  = "recording:s3"
	ComponentUploader     = "recording:upload"
	ComponentListener     = "listener"
	ComponentClient       = "client"
	ComponentBench        = "bench"
	ComponentAudit        = "audit"
	ComponentAccessReqs   = "access-requests"
	ComponentService      = "service"
	ComponentBackend      = "backend"
	ComponentLeafAgents   = "leaf"
	ComponentMemTrim      = "memtrim"
	// The watchers of lib/services default these names themselves
	// (services may not import this package: see NodeWatcherConfig);
	// the process passes them from here.
	ComponentNodeWatcher   = "nodewatcher"
	ComponentLockWatcher   = "watcher:locks"
	ComponentAccessWatcher = "watcher:access"
	ComponentNetWatcher    = "netwatcher"
	ComponentTunnelLocator = "tunnellocator"
)

// Deps are the cross-cutting dependencies of a component. Embed it in a
// component's Config; every field may be left zero.
type Deps struct {
	// Clock: every timer, ticker and timestamp; nil means the real clock.
	Clock clockwork.Clock
	// Logger; nil means logrus's standard logger with the component field.
	Logger logrus.FieldLogger
	// Tracer starts the component's spans; nil means a no-op tracer
	// (tracing off: a span costs an interface call and no allocation).
	Tracer trace.Tracer
	// Metrics is where the component registers its collectors; nil means
	// a private registry (collected, not exported). Tests must never pass
	// prometheus.DefaultRegisterer.
	Metrics prometheus.Registerer
	// Audit receives the component's audit events; nil discards them.
	Audit events.Emitter
}

// noopTracer is stateless; one value serves every component.
var noopTracer trace.Tracer = noop.NewTracerProvider().Tracer("")

// SetDefaults fills the zero fields of d for component (one of the
// Component constants).
func (d *Deps) SetDefaults(component string) {
	if d.Clock == nil {
		d.Clock = clockwork.NewRealClock()
	}
	if d.Logger == nil {
		d.Logger = logrus.WithField("component", component)
	}
	if d.Tracer == nil {
		d.Tracer = noopTracer
	}
	if d.Metrics == nil {
		d.Metrics = prometheus.NewRegistry()
	}
	if d.Audit == nil {
		d.Audit = events.Discard
	}
}
