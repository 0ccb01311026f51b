package service

import (
	"context"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
)

// openAudit starts the audit log: DATA_DIR/log/events.log always, plus the
// backend (searchable with `pctl events ls`) where the auth role runs. It
// is opened before any server and closed after all of them, so the last
// session.end of a drain is still recorded.
func (p *Process) openAudit() error {
	if p.audit != nil {
		return nil
	}
	log, err := events.NewEmitter(events.Config{
		Dir:         p.cfg.LogDir(),
		Backend:     p.backend, // nil without the auth role
		ClusterName: p.clusterName,
		Clock:       p.clock,
		Logger:      p.log.WithField("component", "audit"),
		Metrics:     p.registry,
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.audit = log
	p.onShutdown(func(context.Context) error { return log.Close() })
	return nil
}
