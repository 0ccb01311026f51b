// Package promreg holds what Postern's packages share about Prometheus
// collectors. It imports nothing of Postern's, so the data-type packages
// (events) may use it under lib/api's leaf rule.
package promreg

import (
	"errors"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c, or returns the collector already registered under
// the same name and type: two instances of a component in one process (a
// role restarted in tests, the limiters of several listeners, two Routers)
// share one series set instead of failing.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, trace.Wrap(err)
	}
	return c, nil
}
