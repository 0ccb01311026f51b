package service

import (
	"context"
	"time"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// lockSyncWait bounds how long start-up waits for the first load of the
// lock set. Until it is loaded every server refuses everyone (deny by
// default); waiting here keeps a healthy start from refusing its first
// connections, and a slow auth server does not stop the process from
// coming up (it keeps retrying in the background).
const lockSyncWait = 10 * time.Second

// startLocks starts the process's one LockWatcher, on the auth API's lock
// watch. The node's SSH server, the proxy's SSH server, its Router and its
// web sessions all enforce it.
func (p *Process) startLocks(ctx context.Context) error {
	w, err := services.NewLockWatcher(services.LockWatcherConfig{
		Events: p.authClient.LockEvents(),
		Clock:  p.clock,
		Logger: p.log.WithField("component", observe.ComponentLockWatcher),
		// The same bound as roles and CAs: the last known locks keep
		// denying, and past it a lock set that cannot be vouched for
		// refuses everyone, as one never loaded does.
		MaxStale: accessMaxStale,
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.locks = w
	p.onShutdown(func(context.Context) error { return w.Close() })
	if err := registerStaleMetrics(p.registry, "locks", w.StaleStats); err != nil {
		return trace.Wrap(err)
	}
	wctx, cancel := context.WithTimeout(ctx, lockSyncWait)
	defer cancel()
	if err := w.WaitSynced(wctx); err != nil {
		p.log.WithError(err).Warn("The lock list is not loaded yet: connections are refused until it is.")
	}
	return nil
}

// accessMaxStale is how long every proxy and node answers logins from its
// last view of CAs, roles, trusted clusters and locks after the watch
// feeding it broke (an etcd quorum loss, the auth servers restarting, the
// proxy carrying a tunnel node's watch restarting), before it refuses
// everyone until the watch is back.
//
// Why 5 minutes. While the backend is down nothing can be written: no
// role, CA, trusted cluster or lock can change, so the last view is
// exactly what a backend read would answer and refusing would only turn a
// backend outage into a full SSH outage for users holding valid
// certificates. The view is wrong only when this process alone is cut off
// from a backend that others still write; then the bound is how late a
// new lock, a removed role or a rotated CA can apply here. 5 minutes
// rides out what etcd and auth do on their own (an election, a member
// restart, a rolling upgrade of auth, a proxy restart under a tunnel
// node: seconds to a minute or two), and keeps that delay well below the
// hours a certificate lives; an outage that lasts longer is an incident
// an operator is handling, and deny by default resumes. Every answer from
// a broken watch is counted (postern_access_stale_answers_total) and
// logged once per outage.
const accessMaxStale = 5 * time.Minute

// startAccessCache gives the SSH servers their roles and CAs from memory
// (services.AccessCache): no backend read or auth API call per connection
// or session. It follows the auth API's access watch (roles and CA public
// keys).
func (p *Process) startAccessCache(ctx context.Context) error {
	c, err := services.NewAccessCache(services.AccessCacheConfig{
		Events:     p.authClient.AccessEvents(),
		Clock:      p.clock,
		Logger:     p.log.WithField("component", observe.ComponentAccessWatcher),
		StaleGrace: accessMaxStale,
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.sshAccess = c
	p.onShutdown(func(context.Context) error { return c.Close() })
	if err := registerStaleMetrics(p.registry, "access", c.StaleStats); err != nil {
		return trace.Wrap(err)
	}
	wctx, cancel := context.WithTimeout(ctx, lockSyncWait)
	defer cancel()
	if err := c.WaitSynced(wctx); err != nil {
		p.log.WithError(err).Warn("Roles and CAs are not loaded yet: connections are refused until they are.")
	}
	return nil
}

// registerStaleMetrics exposes a view's answers from a broken watch: the
// window in which a proxy or node lets users in on a view it cannot vouch
// for must be visible to operators, not only in the logs.
func registerStaleMetrics(reg prometheus.Registerer, view string, stats func() services.StaleStats) error {
	labels := prometheus.Labels{"view": view}
	collectors := []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "access", Name: "stale_answers_total",
			Help:        "Logins and sessions answered from the last view while its watch was broken, within the bound.",
			ConstLabels: labels,
		}, func() float64 { return float64(stats().Answers) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "access", Name: "stale_refusals_total",
			Help:        "Logins and sessions refused because the view's watch had been broken for longer than the bound.",
			ConstLabels: labels,
		}, func() float64 { return float64(stats().Refusals) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "postern", Subsystem: "access", Name: "stale_seconds",
			Help:        "How long the view's watch has been broken (0 while it is live).",
			ConstLabels: labels,
		}, func() float64 { return stats().StaleFor.Seconds() }),
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}
