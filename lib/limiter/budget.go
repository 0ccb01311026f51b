package limiter

import (
	"fmt"
	"sync"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/postern-dev/postern/lib/promreg"
)

// Budget is a process's file descriptor budget, shared by all of its
// listeners (proxy SSH, tunnel, peer, web, node).
//
// Why one budget and not a cap per listener: descriptors are one pool per
// process (RLIMIT_NOFILE), and what runs out is that pool, not a port's
// share of it. A flood that fills one port's own cap while the others fill
// theirs still takes the process to EMFILE, and then the failures land
// wherever the next open happens to be: accept backs off on every port,
// a recording upload or a backend write fails, a dial to a node fails.
// With one budget that stops short of the limit (the daemon keeps a
// reserve for everything that is not a listener's connection), the
// connection past it is refused at accept with a reason, and nothing else
// in the process ever sees EMFILE.
//
// Fairness between listeners is not the budget's job: what an
// unauthenticated client can hold on any port is bounded by the
// per-address and handshake caps (Config.MaxHandshakes), far below the
// budget, so a flood of one port leaves the budget to the others; only
// authenticated work (sessions) can spend it all.
//
// A Budget is safe for concurrent use. The zero value is not usable; use
// NewBudget.
type Budget struct {
	cfg BudgetConfig

	held prometheus.Gauge
	// mu guards used. Lock order: a ConnectionLimiter's mu, then this.
	mu   sync.Mutex
	used int
}

// BudgetConfig configures a Budget.
type BudgetConfig struct {
	// Descriptors is how many descriptors the listeners' connections may
	// hold between them. Required, at least 1.
	Descriptors int
	// Reason says where Descriptors comes from, for refusals and logs
	// ("RLIMIT_NOFILE 300 less 256 kept for the rest of the process"), so
	// that a refused client and the operator learn which limit to raise.
	Reason string
	// Metrics: see Config.Metrics.
	Metrics prometheus.Registerer
}

// NewBudget returns a budget of cfg.Descriptors.
func NewBudget(cfg BudgetConfig) (*Budget, error) {
	if cfg.Descriptors < 1 {
		return nil, trace.BadParameter("limiter: a descriptor budget needs at least 1 descriptor, got %d", cfg.Descriptors)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	size, err := promreg.Register(cfg.Metrics, prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "postern", Subsystem: "limiter", Name: "descriptor_budget",
		Help: "File descriptors the listeners' connections may hold between them (RLIMIT_NOFILE less a reserve).",
	}))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	held, err := promreg.Register(cfg.Metrics, prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "postern", Subsystem: "limiter", Name: "descriptors_held",
		Help: "File descriptors held now by connections counted against the descriptor budget.",
	}))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	size.Set(float64(cfg.Descriptors))
	return &Budget{cfg: cfg, held: held}, nil
}

// Descriptors is the budget's size.
func (b *Budget) Descriptors() int { return b.cfg.Descriptors }

// Used is what is held now.
func (b *Budget) Used() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// take spends cost descriptors, or reports false when fewer are left.
func (b *Budget) take(cost int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+cost > b.cfg.Descriptors {
		return false
	}
	b.used += cost
	b.held.Add(float64(cost))
	return true
}

func (b *Budget) give(cost int) {
	b.mu.Lock()
	b.used -= cost
	b.mu.Unlock()
	b.held.Sub(float64(cost))
}

// refusal is the error of a connection the budget cannot hold.
func (b *Budget) refusal(listener string, cost int) error {
	what := "each connection here costs 1"
	if cost != 1 {
		what = fmt.Sprintf("each connection here costs %d: %d sessions", cost, b.cfg.Descriptors/cost)
	}
	if b.cfg.Reason == "" {
		return trace.LimitExceeded("too many connections to %s: the file descriptor budget of %d is spent (%s)",
			listener, b.cfg.Descriptors, what)
	}
	return trace.LimitExceeded("too many connections to %s: the file descriptor budget of %d is spent (%s; %s)",
		listener, b.cfg.Descriptors, b.cfg.Reason, what)
}
