package limiter

import (
	"errors"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	// refusals counts every refusal by listener and cap.
	refusals *prometheus.CounterVec
	// active is what is held through the limiter now, by listener and
	// kind (connections, user, sessions, forward).
	active *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "postern", Subsystem: "limiter", Name: "refusals_total",
		Help: "Connections, sessions and forwards refused by a cap or rate limit, by listener and cap.",
	}, []string{"listener", "cap"})
	active := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "postern", Subsystem: "limiter", Name: "active",
		Help: "Connections, sessions and forwarded connections open through a limiter, by listener and kind.",
	}, []string{"listener", "kind"})
	var err error
	if refusals, err = register(reg, refusals); err != nil {
		return nil, trace.Wrap(err)
	}
	if active, err = register(reg, active); err != nil {
		return nil, trace.Wrap(err)
	}
	return &metrics{refusals: refusals, active: active}, nil
}

// register registers c, or returns the collector already registered under
// the same name, so that the limiters of several listeners (and a role
// restarted in tests) share one series set told apart by labels.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, trace.Wrap(err)
	}
	return c, nil
}
