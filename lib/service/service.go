// Package service wires Postern's roles (auth, proxy, node) together from a
// config and owns the process lifecycle: start-up order, the listeners, and
// graceful shutdown.
//
// Start-up order matters and is fixed: the data dir and the host UUID first
// (cheap checks that fail with a clear line), then the auth role (backend,
// CAs, API), then the identities of the other roles (issued by the local auth
// server, reused from the data dir, or obtained by joining with a token),
// then the node and proxy listeners, and diagnostics last. Shutdown runs the
// same list backwards: stop accepting, drain sessions for the grace period,
// then close what is left.
package service

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/memtrim"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/observe/provider"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/proxy/health"
	"github.com/postern-dev/postern/lib/reversetunnel"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
)

// Listener names, for Process.Addr.
const (
	ListenerAuth     = "auth"
	ListenerNode     = "node"
	ListenerProxySSH = "proxy_ssh"
	ListenerWeb      = "web"
	ListenerDiag     = "diag"
)

// Options are what tests inject; the zero value is what the daemon uses.
type Options struct {
	// Clock defaults to the real clock.
	Clock clockwork.Clock
	// Logger defaults to a logger built from the config's log settings.
	Logger logrus.FieldLogger
	// BcryptCost of new password hashes; zero means bcrypt's default.
	// Tests lower it: one default-cost hash takes seconds under -race.
	BcryptCost int
}

// Process is one running postern: the roles of its config.
type Process struct {
	cfg   *config.Config
	log   logrus.FieldLogger
	clock clockwork.Clock
	opts  Options

	registry *prometheus.Registry
	diag     *diagServer
	// tracer is the tracing section's provider (startTracing); nil
	// before Start, which components take as tracing off.
	tracer *provider.Provider

	// hostUUID is this host's UUID: made up on the first start of an
	// auth host, assigned by the auth server at join otherwise (empty
	// until then). hostUUIDBound is set once an identity in the data dir
	// or a join has confirmed it, after which nothing may change it.
	hostUUID      string
	hostUUIDBound bool
	clusterName   string

	backend    backend.Backend
	store      *services.Store
	authServer *auth.Server
	authAPI    *auth.APIServer
	// authClient is the host roles' client of auth, in this process or
	// not (authClientFor): as the proxy when it runs here, else as the
	// node. The process-wide views (locks, roles and CAs) read through
	// it. authClients holds one client per role.
	authClient  *auth.Client
	authClients map[string]*auth.Client

	// audit is the audit log every server writes to.
	audit *events.Log

	nodeServer *srv.Server
	heartbeat  *auth.Heartbeat
	// proxyHeartbeat announces this proxy's `proxy` resource.
	proxyHeartbeat *auth.Heartbeat
	// peerAddr is the peer address this proxy advertises ("" when not a
	// proxy).
	peerAddr string
	// drainers are the proxy's client-facing servers' Shutdowns (SSH
	// and web), run together by drainFrontends.
	drainers []func(context.Context) error
	// stopPeering ends this proxy's leases and new peered dials at the
	// start of a shutdown (see startPeering).
	stopPeering func(context.Context) error
	// tunnelAgent is a node behind NAT's agent; tunnelServer the proxy's
	// tunnel port. Nil when not running.
	tunnelAgent  *reversetunnel.Pool
	tunnelServer *reversetunnel.Server
	// leaves are the leaf clusters' tunnels on this (root) proxy's
	// tunnel port (leaf.go); nil when it takes none.
	leaves      *reversetunnel.Leaves
	proxySSH    *srv.Server
	nodeWatcher *services.NodeWatcher
	// openSSHHealth is the proxy's health checker of OpenSSH nodes; its
	// offline list rides the proxy heartbeat.
	openSSHHealth *health.Checker
	router        *proxy.Router
	// locks is the lock set every server here enforces (locks.go).
	locks *services.LockWatcher
	// sshAccess is what the SSH servers check certificates and roles
	// against: the in-memory AccessCache when the backend is here (see
	// startAccessCache), else the auth client.
	sshAccess srv.AccessPoint

	// mu guards listeners.
	mu        sync.Mutex
	listeners map[string]*utils.RetryingListener

	// budget is the descriptor budget every listener's connections share
	// (nil: none), made once by descriptorBudget.
	budgetOnce sync.Once
	budget     *limiter.Budget

	// closers run in reverse order on shutdown.
	closers []func(context.Context) error

	wg    sync.WaitGroup
	errCh chan error
}

// New validates cfg; nothing is started.
func New(cfg *config.Config, opts Options) (*Process, error) {
	if cfg == nil {
		return nil, trace.BadParameter("missing config")
	}
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Logger == nil {
		opts.Logger = newLogger(os.Stderr, cfg.LogFormat, cfg.Debug)
	}
	// The Go and process collectors: goroutines, heap and resident
	// memory are what a proxy's cost per session is measured in (psh
	// bench --hold reads go_goroutines and process_resident_memory_bytes).
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Process{
		cfg:       cfg,
		log:       opts.Logger.WithField("component", observe.ComponentService),
		clock:     opts.Clock,
		opts:      opts,
		registry:  reg,
		listeners: map[string]*utils.RetryingListener{},
		errCh:     make(chan error, 8),
	}, nil
}

// Run starts a process and runs it until ctx is done or a server fails,
// then shuts it down gracefully.
func Run(ctx context.Context, cfg *config.Config) error {
	p, err := New(cfg, Options{})
	if err != nil {
		return trace.Wrap(err)
	}
	tuneRuntime(p.cfg, p.log)
	hooks := p.startDaemonHooks() // SIGHUP reloads, systemd notices (systemd.go)
	defer hooks.stop()
	// The idle-memory trimmer is the other half of gc_percent 400 (see
	// lib/memtrim): a daemon concern, like the GC target, so Run starts it
	// and Start (tests, embedding) does not.
	trimmer, err := memtrim.New(memtrim.Config{Deps: p.deps(observe.ComponentMemTrim, nil)})
	if err != nil {
		return trace.Wrap(err)
	}
	// The trimmer runs for the process's life, past ctx (ended by the defer).
	trimCtx, stopTrim := context.WithCancel(context.Background())
	trimDone := make(chan struct{})
	go func() { defer close(trimDone); trimmer.Run(trimCtx) }()
	defer func() { stopTrim(); <-trimDone }()
	if err := p.Start(ctx); err != nil {
		// ctx may be done already: shutdown gets a grace of its own.
		shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
		defer cancel()
		p.Shutdown(shutdownCtx)
		return trace.Wrap(err)
	}
	hooks.started()
	var runErr error
	select {
	case <-ctx.Done():
		p.log.Info("Shutting down: draining sessions.")
	case runErr = <-p.errCh:
		p.log.WithError(runErr).Error("A server failed; shutting down.")
	}
	// ctx is done here: shutdown gets a grace of its own.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	if err := p.Shutdown(shutdownCtx); err != nil {
		p.log.WithError(err).Warn("Shutdown was not clean.")
	}
	p.log.Info("Stopped.")
	return trace.Wrap(runErr)
}

// Start brings up every role; when it returns nil, every listener accepts.
func (p *Process) Start(ctx context.Context) error {
	cfg := p.cfg
	if err := ensureDataDir(cfg.DataDir, p.log); err != nil {
		return trace.Wrap(err)
	}
	// The auth role's host makes up its own UUID (it is the authority).
	// Any other host is given one by the auth server when it joins; until
	// then the data dir may hold one from an earlier identity, or none.
	var id string
	var err error
	if cfg.HasRole(config.RoleAuth) {
		id, err = readOrCreateUUID(cfg.HostUUIDPath())
	} else {
		id, err = readUUID(cfg.HostUUIDPath())
	}
	if err != nil {
		return trace.Wrap(err)
	}
	p.hostUUID = id
	p.clusterName = cfg.ClusterName
	if err := p.startTracing(); err != nil {
		return trace.Wrap(err)
	}

	if cfg.HasRole(config.RoleAuth) {
		if err := p.startAuth(ctx); err != nil {
			return trace.Wrap(err)
		}
	}
	// The host roles open the audit log themselves once they know the
	// cluster (a joined host learns its name from its identity); this
	// covers a process that runs none.
	if err := p.startHostRoles(ctx); err != nil {
		return trace.Wrap(err)
	}
	if err := p.openAudit(); err != nil {
		return trace.Wrap(err)
	}
	if err := p.startDiag(); err != nil {
		return trace.Wrap(err)
	}
	p.log.WithFields(logrus.Fields{
		"roles": strings.Join(cfg.Roles, ","), "cluster": p.clusterName, "host_uuid": p.hostUUID,
	}).Info("Postern is ready.")
	return nil
}

// Addr returns the bound address of a listener (see the Listener* names),
// or nil when the process does not run it.
func (p *Process) Addr(name string) net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ln, ok := p.listeners[name]; ok {
		return ln.Addr()
	}
	return nil
}

// HostUUID is this host's UUID.
func (p *Process) HostUUID() string { return p.hostUUID }

// ClusterName is the cluster this process belongs to.
func (p *Process) ClusterName() string { return p.clusterName }

// Errors delivers a server's fatal error.
func (p *Process) Errors() <-chan error { return p.errCh }

// listen binds addr and records the listener under name.
func (p *Process) listen(name, addr string) (net.Listener, error) {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "%s: cannot listen on %s: %v", name, addr, unwrapOpError(err))
	}
	// Out of descriptors, Accept backs off and keeps the listener instead
	// of ending the server (seed 004); /readyz reports the streak. The
	// real clock on purpose: a test's fake clock must not stall it.
	deps := p.depsWith(observe.ComponentListener, nil, logrus.Fields{"listener": name})
	deps.Clock = nil
	ln := utils.NewRetryingListener(raw, utils.RetryConfig{Name: name, Deps: deps})
	p.mu.Lock()
	p.listeners[name] = ln
	p.mu.Unlock()
	// Closed last (closers run in reverse): a server's own Shutdown closes
	// it first, and this covers a start-up that failed before any server
	// took the listener over.
	p.onShutdown(func(context.Context) error {
		ln.Close()
		return nil
	})
	return ln, nil
}

func unwrapOpError(err error) error {
	var oe *net.OpError
	if e, ok := err.(*net.OpError); ok {
		oe = e
		if oe.Err != nil {
			return oe.Err
		}
	}
	return err
}

// goServe runs a server loop owned by the process; its failure ends Run.
func (p *Process) goServe(name string, serve func() error) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := serve(); err != nil {
			p.log.WithError(err).WithField("server", name).Error("Server stopped with an error.")
			select {
			case p.errCh <- trace.Wrap(err, "%s", name):
			default:
			}
		}
	}()
}

// ignoreClosed maps the "server closed" a Serve loop returns after
// Shutdown to nil: it is the expected end, not a failure.
func ignoreClosed(err error) error {
	if errors.Is(err, srv.ErrServerClosed) {
		return nil
	}
	return err
}

// onShutdown registers a closer; closers run in reverse order.
func (p *Process) onShutdown(fn func(context.Context) error) {
	p.closers = append(p.closers, fn)
}

// Shutdown stops everything: listeners first, then sessions drain until
// ctx is done, then the rest closes. It waits for every server loop.
func (p *Process) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(p.closers) - 1; i >= 0; i-- {
		if err := p.closers[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	p.closers = nil
	p.wg.Wait()
	return trace.NewAggregate(errs...)
}
