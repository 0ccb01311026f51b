package service

import (
	"context"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/events/export"
	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/observe"
)

// openAudit starts the audit log: DATA_DIR/log/events.log always, plus the
// backend (searchable with `pctl events ls`) where the auth role runs, or,
// where it does not, shipping to the auth server with this host's identity
// (auth stamps its cluster name and this host's UUID on what it records).
// It is opened before any server and closed after all of them (and before
// the auth client), so the last session.end of a drain is still recorded
// and shipped. It must be opened after the host knows its cluster: a
// joined host learns the name from its identity (startHostRoles), and
// events stamped with the config's default name would be misfiled.
func (p *Process) openAudit() error {
	if p.audit != nil {
		return nil
	}
	cfg := events.Config{
		Dir:         p.cfg.LogDir(),
		Backend:     p.backend, // nil without the auth role
		ClusterName: p.clusterName,
		Clock:       p.clock,
		Logger:      p.log.WithField("component", observe.ComponentAudit),
		Metrics:     p.registry,
		BatchWait:   events.DefaultBatchWait,
	}
	if p.backend == nil && p.authClient != nil {
		cfg.Remote = p.authClient
	}
	// audit: in postern.yaml: a copy of what this process emits (lib/events/export).
	xcfg := p.cfg.Audit.ExportConfig()
	xcfg.Deps = p.deps(observe.ComponentAudit, nil)
	exporters, err := export.New(xcfg)
	if err != nil {
		return trace.Wrap(err)
	}
	cfg.Exporters = exporters
	log, err := events.NewEmitter(cfg)
	if err != nil {
		return trace.Wrap(err)
	}
	p.audit = log
	p.onShutdown(func(context.Context) error { return log.Close() })
	return nil
}

// auditRefusal records connections a listener refused before any
// handshake (limiter.ListenerOptions.OnRefuse, already throttled per
// address and cap). Listeners accept only once their servers run, after
// the audit log is open; a refusal before that has nowhere to go.
func (p *Process) auditRefusal(r limiter.Refusal) {
	if p.audit == nil {
		return
	}
	addr := ""
	if r.Addr != nil {
		addr = r.Addr.String()
	}
	// A refusal before any handshake: no connection context exists yet.
	p.audit.Emit(context.Background(), events.Event{Type: events.ConnRefused, Fields: events.Fields{
		events.FieldListener:   r.Listener,
		events.FieldCap:        r.Cap,
		events.FieldRemoteAddr: addr,
		events.FieldReason:     r.Err.Error(),
		events.FieldCount:      r.Count,
	}})
}
