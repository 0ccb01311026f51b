package service

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/etcdbk"
	"github.com/postern-dev/postern/lib/backend/schema"
	"github.com/postern-dev/postern/lib/backend/sqlite"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/events/export"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
	"github.com/postern-dev/postern/lib/web"
)

// startAuth opens the backend, loads or creates the CAs and serves the auth
// API.
func (p *Process) startAuth(ctx context.Context) error {
	cfg := p.cfg
	if err := checkClusterName(filepath.Join(cfg.DataDir, "cluster_name"), cfg.ClusterName); err != nil {
		return trace.Wrap(err)
	}
	raw, err := p.openBackend(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	// Refuse a backend of a newer Postern, migrate an older one.
	if err := schema.Migrate(ctx, raw, p.log.WithField("component", observe.ComponentBackend)); err != nil {
		raw.Close()
		return trace.Wrap(err)
	}
	b, err := backend.NewInstrumented(raw, p.registry, nil)
	if err != nil {
		raw.Close()
		return trace.Wrap(err)
	}
	p.backend = b
	p.onShutdown(func(context.Context) error { return b.Close() })
	p.store = services.NewStore(b)
	if err := p.openAudit(); err != nil {
		return trace.Wrap(err)
	}

	recordings, err := p.openRecordings(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	ln, err := p.listen(ListenerAuth, cfg.AuthAddr)
	if err != nil {
		return trace.Wrap(err)
	}
	notifier, err := p.requestNotifier()
	if err != nil {
		return trace.Wrap(err)
	}
	p.authServer, err = auth.NewServer(auth.ServerConfig{
		RequestNotifier:  notifier,
		Store:            p.store,
		ClusterName:      cfg.ClusterName,
		AdminIdentityDir: cfg.AdminIdentityDir(),
		PublicAddrs:      cfg.PublicAddrs,
		HostUUID:         p.hostUUID,
		BcryptCost:       p.opts.BcryptCost,
		Deps:             p.deps(observe.ComponentAuth, p.audit),
		AuditLog:         p.audit,
		Recordings:       recordings,
		IdentifyRootUser: func(ctx context.Context, store *services.Store, clusterName string, clock clockwork.Clock, cert *ssh.Certificate) (*authz.Identity, error) {
			return srv.IdentifyRootUser(ctx, store, clusterName, clock, cert)
		},
		// A leaf reaches its root's auth API through the root proxy's
		// join relay: the same pinned path a node behind NAT joins by.
		DialProxy: web.DialJoinRelay,
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.runAccessRequestExpiry()
	p.authAPI, err = auth.NewAPIServer(auth.APIConfig{Auth: p.authServer, Listener: ln})
	if err != nil {
		return trace.Wrap(err)
	}
	p.goServe("auth API", p.authAPI.Serve)
	p.onShutdown(func(ctx context.Context) error { return p.authAPI.Shutdown(ctx) })

	// pctl on this machine finds the API through this file.
	addrFile := filepath.Join(cfg.AdminIdentityDir(), config.AuthAddrFile)
	if err := utils.WriteFileAtomic(addrFile, []byte(dialableAddr(ln.Addr())+"\n"), 0o600); err != nil {
		return trace.Wrap(err)
	}
	p.log.WithField("addr", ln.Addr().String()).Info("Auth API is serving.")
	return nil
}

// openBackend opens the configured backend.
func (p *Process) openBackend(ctx context.Context) (backend.Backend, error) {
	switch p.cfg.Backend.Type {
	case config.BackendEtcd:
		return openEtcd(ctx, p)
	default:
		b, err := sqlite.New(ctx, sqlite.Config{
			Path:   p.cfg.BackendPath(),
			Clock:  p.clock,
			Logger: p.log.WithField("component", observe.ComponentBackend),
		})
		return b, trace.Wrap(err)
	}
}

// checkClusterName pins the data dir to the cluster it was created for:
// the name is baked into every CA and certificate, so starting the same data
// dir under another name would silently mint a second set of CAs.
func checkClusterName(path, name string) error {
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if have := strings.TrimSpace(string(data)); have != name {
			return trace.BadParameter("data dir %s belongs to cluster %q, not %q: use --cluster-name %s or another data dir",
				filepath.Dir(path), have, name, have)
		}
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return trace.Wrap(utils.WriteFileAtomic(path, []byte(name+"\n"), 0o600))
	default:
		return trace.ConvertSystemError(err)
	}
}

// dialableAddr turns a listen address into one a local client can dial:
// an unspecified host (0.0.0.0, ::) becomes loopback.
func dialableAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsUnspecified() {
		if ip != nil && ip.To4() == nil {
			host = "::1"
		} else {
			host = "127.0.0.1"
		}
	}
	return net.JoinHostPort(host, port)
}

// advertisedAddr is the address other machines use to reach a listener:
// the listen host when it is a concrete address, otherwise the first
// non-loopback IP of this machine (loopback when there is none).
func advertisedAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		return a.String()
	}
	if ip := firstNonLoopbackIP(); ip != "" {
		return net.JoinHostPort(ip, port)
	}
	return net.JoinHostPort("127.0.0.1", port)
}

func firstNonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String()
		}
	}
	return ""
}

// listenIPs lists the IPs a listener answers on, for certificate
// principals: the concrete IP, or every local IP when it listens on all.
func listenIPs(a net.Addr) []string {
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return nil
	}
	ip := net.ParseIP(host)
	if ip != nil && !ip.IsUnspecified() {
		return []string{ip.String()}
	}
	var out []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

// openEtcd opens the etcd backend for clusters that outgrow one machine.
func openEtcd(ctx context.Context, p *Process) (backend.Backend, error) {
	cfg := etcdbk.Config{
		Endpoints: p.cfg.Backend.EtcdEndpoints,
		Prefix:    p.cfg.Backend.EtcdPrefix,
		Clock:     p.clock,
		Logger:    p.log.WithField("component", observe.ComponentBackend),
	}
	if t := p.cfg.Backend.EtcdTLS; t != nil {
		tlsCfg, err := etcdbk.LoadTLS(t.CAFile, t.CertFile, t.KeyFile)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		cfg.TLS = tlsCfg
	}
	b, err := etcdbk.New(ctx, cfg)
	return b, trace.Wrap(err)
}

// runAccessRequestExpiry sweeps expired access requests until shutdown
// (auth ends the grants of those that expire).
func (p *Process) runAccessRequestExpiry() {
	// The sweep runs until shutdown (the closer cancels it).
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.authServer.RunAccessRequestExpiry(ctx)
	}()
	p.onShutdown(func(context.Context) error {
		cancel()
		<-done
		return nil
	})
}

// requestNotifier starts the access_requests webhook, if configured; it
// is closed (what is queued delivered for a while) at shutdown.
func (p *Process) requestNotifier() (events.Exporter, error) {
	xcfg := p.cfg.AccessRequests.ExportConfig()
	if xcfg.Webhook == "" {
		return nil, nil
	}
	xcfg.Deps = p.deps(observe.ComponentAccessReqs, nil)
	// A private registry: the audit exporters register the same
	// counters in the process's.
	xcfg.Metrics = nil
	w, err := export.NewWebhook(xcfg)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	p.onShutdown(func(ctx context.Context) error { return w.Close(ctx) })
	return w, nil
}
