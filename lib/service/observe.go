package service

import (
	"context"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/observe/provider"
)

// startTracing makes the process's tracer provider from the tracing
// section (a no-op one when it is unset) and flushes it last on shutdown:
// closers run in reverse, so the spans the other closers end still go out.
func (p *Process) startTracing() error {
	tp, err := provider.New(p.cfg.Tracing, p.cfg.NodeName, p.log.WithField("component", observe.ComponentTracing))
	if err != nil {
		return trace.Wrap(err)
	}
	p.tracer = tp
	p.onShutdown(func(ctx context.Context) error { return tp.Shutdown(ctx) })
	if p.cfg.Tracing.Enabled() {
		p.log.WithField("endpoint", p.cfg.Tracing.Endpoint).Info("Tracing to an OTLP collector.")
	}
	return nil
}

// deps are the cross-cutting dependencies of component in this process;
// audit may be nil (the component discards its events).
func (p *Process) deps(component string, audit events.Emitter) observe.Deps {
	d := observe.Deps{
		Clock:   p.clock,
		Logger:  p.log.WithField("component", component),
		Metrics: p.registry,
		Audit:   audit,
	}
	if p.tracer != nil {
		d.Tracer = p.tracer.Tracer(component)
	}
	return d
}

// depsWith is deps with more log fields (a leaf's root, say).
func (p *Process) depsWith(component string, audit events.Emitter, fields logrus.Fields) observe.Deps {
	d := p.deps(component, audit)
	d.Logger = d.Logger.WithFields(fields)
	return d
}
