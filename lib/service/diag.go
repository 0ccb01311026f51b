package service

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/postern-dev/postern/lib/services"
)

// healthCheck is one component's view of itself: nil when it can serve.
type healthCheck func(ctx context.Context) error

// diagServer serves /metrics, /healthz, /readyz (and /debug/pprof/ when
// enabled) on the diagnostics
// address. /healthz answers whether the process is alive (always 200 while
// it serves); /readyz runs every registered check, so a load balancer stops
// sending users to a proxy whose NodeWatcher lost its watch or whose backend
// is gone.
type diagServer struct {
	registry *prometheus.Registry
	srv      *http.Server

	// mu guards checks.
	mu     sync.Mutex
	checks map[string]healthCheck
}

func newDiagServer(reg *prometheus.Registry, withPprof bool) *diagServer {
	d := &diagServer{registry: reg, checks: map[string]healthCheck{}}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("/readyz", d.readyz)
	if withPprof {
		// Registered on this mux only (the package's init also adds them
		// to http.DefaultServeMux, which nothing here serves): off unless
		// diag_pprof is set, and config refuses it on a non-loopback
		// diagnostics address.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return d
}

func (d *diagServer) addCheck(name string, c healthCheck) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checks[name] = c
}

func (d *diagServer) readyz(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	names := make([]string, 0, len(d.checks))
	for n := range d.checks {
		names = append(names, n)
	}
	checks := make(map[string]healthCheck, len(d.checks))
	for n, c := range d.checks {
		checks[n] = c
	}
	d.mu.Unlock()
	sort.Strings(names)
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	status, code := map[string]string{}, http.StatusOK
	for _, n := range names {
		if err := checks[n](ctx); err != nil {
			status[n] = err.Error()
			code = http.StatusServiceUnavailable
		} else {
			status[n] = "ok"
		}
	}
	writeJSON(w, code, status)
}

func (d *diagServer) serve(ln net.Listener) error {
	if err := d.srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		return trace.Wrap(err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// startDiag serves diagnostics and registers the health checks of the
// roles this process runs.
func (p *Process) startDiag() error {
	ln, err := p.listen(ListenerDiag, p.cfg.DiagAddr)
	if err != nil {
		if p.cfg.DiagAddrDefaulted && errors.Is(err, syscall.EADDRINUSE) {
			p.log.WithField("diag_addr", p.cfg.DiagAddr).Warn("The default diagnostics address is in use (another Postern process on this machine?): " +
				"this process serves no /metrics, /healthz or /readyz. Set --diag-addr (diag_addr: in postern.yaml) to serve them.")
			return nil
		}
		return trace.Wrap(err)
	}
	d := newDiagServer(p.registry, p.cfg.DiagPprof)
	if p.cfg.DiagPprof {
		p.log.WithField("diag_addr", ln.Addr().String()).Warn("pprof is served under /debug/pprof/ on the diagnostics address (diag_pprof).")
	}
	p.diag = d
	if p.store != nil {
		store := p.store
		d.addCheck("backend", func(ctx context.Context) error {
			_, err := store.Backend().Get(ctx, "/healthcheck")
			if err != nil && !trace.IsNotFound(err) {
				return err
			}
			return nil
		})
	}
	if p.nodeWatcher != nil {
		w := p.nodeWatcher
		d.addCheck("node_watcher", func(context.Context) error { return w.Healthy() })
	}
	p.mu.Lock()
	for name, rl := range p.listeners {
		d.addCheck("accept_"+name, func(context.Context) error { return rl.Healthy() })
	}
	p.mu.Unlock()
	p.goServe("diagnostics", func() error { return d.serve(ln) })
	p.onShutdown(func(ctx context.Context) error { return d.srv.Shutdown(ctx) })
	return nil
}

// registerNodeWatcherMetrics exposes the NodeWatcher's size and health:
// a proxy routing from a stale or empty view is the first thing to rule out
// when users cannot reach a node.
func registerNodeWatcherMetrics(reg prometheus.Registerer, nw *services.NodeWatcher) error {
	collectors := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "postern", Subsystem: "nodewatcher", Name: "nodes",
			Help: "Nodes in the proxy's in-memory inventory.",
		}, func() float64 { return float64(nw.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "postern", Subsystem: "nodewatcher", Name: "healthy",
			Help: "1 while the NodeWatcher's backend watch is live, 0 while it re-syncs.",
		}, func() float64 {
			if nw.Healthy() != nil {
				return 0
			}
			return 1
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "postern", Subsystem: "nodewatcher", Name: "failures_total",
			Help: "Times the NodeWatcher's watch broke and it had to re-sync.",
		}, func() float64 { return float64(nw.Failures()) }),
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}
