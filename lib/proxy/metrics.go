package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/postern-dev/postern/lib/promreg"
)

type routerMetrics struct {
	routeDuration prometheus.Histogram
	notFound      prometheus.Counter
	ambiguous     prometheus.Counter
	dialFailures  prometheus.Counter
	// tunnelRouting times finding a node's tunnel, by result (found,
	// timeout, canceled); tunnelTimeouts counts finds that gave up.
	tunnelRouting  *prometheus.HistogramVec
	tunnelTimeouts prometheus.Counter
}

func newRouterMetrics(reg prometheus.Registerer) (*routerMetrics, error) {
	m := &routerMetrics{
		routeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "postern", Subsystem: "proxy", Name: "route_duration_seconds",
			Help: "Time to decide where a target routes (no dialing).",
			// A decision is a few map lookups: microseconds. The
			// buckets reach 16ms to catch a slow networking-config read.
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 8),
		}),
		notFound: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "proxy", Name: "route_not_found_total",
			Help: "Targets that matched no node (or an unknown cluster).",
		}),
		ambiguous: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "proxy", Name: "route_ambiguous_total",
			Help: "Targets refused because they matched several nodes under unambiguous_match.",
		}),
		dialFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "proxy", Name: "dial_failures_total",
			Help: "Dials to a routed node that failed or timed out.",
		}),
		tunnelRouting: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "postern", Name: "tunnel_routing_duration_seconds",
			Help: "Time to find a tunnel to a node on this proxy (including the wait for one to register), by result.",
			// GitLab kas's buckets (seed 003): from a tunnel already here
			// (sub-millisecond) to the longest sensible find timeout.
			Buckets: []float64{0.001, 0.004, 0.016, 0.064, 0.256, 1.024, 4.096, 16.384},
		}, []string{"result"}),
		tunnelTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "postern", Name: "tunnel_routing_timeout_total",
			Help: "Dials to a tunnel node that gave up: no tunnel reached this proxy within tunnel_find_timeout.",
		}),
	}
	var err error
	if m.tunnelRouting, err = promreg.Register(reg, m.tunnelRouting); err != nil {
		return nil, err
	}
	m.routeDuration, err = promreg.Register(reg, m.routeDuration)
	if err != nil {
		return nil, err
	}
	for _, c := range []*prometheus.Counter{&m.notFound, &m.ambiguous, &m.dialFailures, &m.tunnelTimeouts} {
		if *c, err = promreg.Register(reg, *c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
