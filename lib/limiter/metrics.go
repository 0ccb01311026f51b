package limiter

import (
	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/postern-dev/postern/lib/promreg"
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
	if refusals, err = promreg.Register(reg, refusals); err != nil {
		return nil, trace.Wrap(err)
	}
	if active, err = promreg.Register(reg, active); err != nil {
		return nil, trace.Wrap(err)
	}
	return &metrics{refusals: refusals, active: active}, nil
}
