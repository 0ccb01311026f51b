package service

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/reversetunnel"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
	"github.com/postern-dev/postern/lib/web"
)

// Leaf clusters, the proxy's part (docs/leaf-clusters.md). On a root, the
// tunnel port admits its leaves' proxies (reversetunnel.Leaves, fed by
// this cluster's remote_cluster records and the leaves' host CAs). On a
// leaf, the proxy keeps a tunnel to the proxy of every root it trusts
// (leafAgents), with a certificate of role leaf from its own auth server.

// clusterTrustAPI is what the proxy's leaf code asks of its auth server
// (the proxy's auth client).
type clusterTrustAPI interface {
	GetRemoteClusters(ctx context.Context) ([]services.RemoteCluster, error)
	GetCertAuthority(ctx context.Context, clusterName string, t services.CertAuthType, withSecrets bool) (*services.CertAuthority, error)
	TouchRemoteCluster(ctx context.Context, name string) error
	GetTrustedClusters(ctx context.Context) ([]services.TrustedCluster, error)
	GenerateLeafTunnelCert(ctx context.Context, publicKey []byte) ([]byte, error)
}

var _ clusterTrustAPI = (*auth.Client)(nil)

// leafTrust is reversetunnel.LeafTrust: host CAs from the proxy's
// in-memory access cache (cas), the leaf check and the reports through
// the auth server (api). A cluster is a leaf while its remote_cluster
// record exists (a CA alone is not enough: this cluster also holds the
// CAs of the roots it trusts).
type leafTrust struct {
	api clusterTrustAPI
	cas caGetter
}

// caGetter reads a CA's public keys (srv.AccessPoint has it).
type caGetter interface {
	GetCertAuthority(ctx context.Context, clusterName string, t services.CertAuthType, withSecrets bool) (*services.CertAuthority, error)
}

func (l leafTrust) HostCAs(ctx context.Context, name string) ([]ssh.PublicKey, error) {
	ca, err := l.cas.GetCertAuthority(ctx, name, services.HostCA, false)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return parseCAKeys(ca)
}

func (l leafTrust) IsLeaf(ctx context.Context, name string) error {
	rcs, err := l.api.GetRemoteClusters(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	for _, rc := range rcs {
		if rc.Name == name {
			return nil
		}
	}
	return trace.NotFound("remote cluster %q not found", name)
}

func (l leafTrust) Touch(ctx context.Context, name string) error {
	return trace.Wrap(l.api.TouchRemoteCluster(ctx, name))
}

func parseCAKeys(ca *services.CertAuthority) ([]ssh.PublicKey, error) {
	out := make([]ssh.PublicKey, 0, len(ca.SSHPublicKeys))
	for _, k := range ca.SSHPublicKeys {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return nil, trace.BadParameter("%s CA of cluster %q: %v", ca.Type, ca.ClusterName, err)
		}
		out = append(out, pub)
	}
	return out, nil
}

// newLeaves is the root side: nil when the proxy has no auth server.
func (p *Process) newLeaves(id *auth.Identity) (*reversetunnel.Leaves, error) {
	var api clusterTrustAPI = p.authClient
	var cas caGetter = api
	if p.sshAccess != nil {
		cas = p.sshAccess
	}
	l, err := reversetunnel.NewLeaves(reversetunnel.LeavesConfig{
		Trust:       leafTrust{api: api, cas: cas},
		ClusterName: p.clusterName,
		Deps:        p.deps(observe.ComponentTunnelLeaves, nil),
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "postern", Name: "leaf_tunnels",
		Help: "Reverse tunnels from leaf clusters' proxies connected to this proxy.",
	}, func() float64 { return float64(l.Count()) })
	if err := p.registry.Register(g); err != nil {
		return nil, trace.Wrap(err)
	}
	p.leaves = l
	return l, nil
}

// leafTunnels is the Router's view of the leaf tunnels here (nil: none
// taken, so no leaf is routed to from this proxy except through peers,
// which also need Leaves to be set: a proxy without auth has neither).
func (p *Process) leafTunnels() proxy.LeafTunnels {
	if p.leaves == nil {
		return nil
	}
	return p.leaves
}

// leafHostCAs reads a leaf's host CA keys (from the access cache when
// it is here) for the web terminal's host check; nil when this proxy
// takes no leaf tunnels.
func (p *Process) leafHostCAs(id *auth.Identity) func(ctx context.Context, cluster string) ([]ssh.PublicKey, error) {
	if p.leaves == nil {
		return nil
	}
	var api clusterTrustAPI = p.authClient
	var cas caGetter = api
	if p.sshAccess != nil {
		cas = p.sshAccess
	}
	lt := leafTrust{api: api, cas: cas}
	return func(ctx context.Context, cluster string) ([]ssh.PublicKey, error) {
		if err := lt.IsLeaf(ctx, cluster); err != nil {
			return nil, trace.Wrap(err)
		}
		return lt.HostCAs(ctx, cluster)
	}
}

// remoteClusterTTL is how long the proxy reuses its list of leaves for
// listings (proxysites, /webapi/clusters): status and last_connected are
// reported every 5s anyway, and routing never reads the list (a leaf is
// routed to while its tunnel is up).
const remoteClusterTTL = 3 * time.Second

// remoteClusterLister lists this cluster's leaves, cached
// remoteClusterTTL; nil when the proxy has no auth server to ask.
func (p *Process) remoteClusterLister(id *auth.Identity) proxy.RemoteClusterLister {
	if p.leaves == nil {
		return nil
	}
	var api clusterTrustAPI = p.authClient
	var (
		mu      sync.Mutex
		cached  []services.RemoteCluster
		fetched time.Time
	)
	return func(ctx context.Context) ([]services.RemoteCluster, error) {
		mu.Lock()
		defer mu.Unlock()
		if !fetched.IsZero() && p.clock.Since(fetched) < remoteClusterTTL {
			return cached, nil
		}
		rcs, err := api.GetRemoteClusters(ctx)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		cached, fetched = rcs, p.clock.Now()
		return rcs, nil
	}
}

// leafReconcileInterval is how often a leaf's proxy compares the tunnels
// it keeps with the trusted_clusters: a new trust gets its tunnel, and a
// removed one loses it, within this.
const leafReconcileInterval = 5 * time.Second

// leafAgents keeps tunnels to every proxy of each trusted root (a pool
// per root, started at the proxy its trusted_cluster names). It owns its loop and its agents; Close stops
// both.
type leafAgents struct {
	p   *Process
	api clusterTrustAPI
	log logrus.FieldLogger
	// transport serves the roots' routing requests with this proxy's
	// Router.
	transport *proxy.LeafTransport
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}

	// signer is the leaf tunnel certificate's, made on first use (only
	// the loop goroutine touches it).
	signer ssh.Signer
	// mu guards agents: by root cluster name.
	mu     sync.Mutex
	agents map[string]*leafAgent
}

type leafAgent struct {
	proxyAddr string
	agent     *reversetunnel.Pool
}

// startLeafAgents runs the leaf side on this proxy: the tunnels to its
// roots, and the routing requests they send over them, served by this
// proxy's Router (p.router, set before) among the nodes the root user's
// mapped roles reach here.
func (p *Process) startLeafAgents(id *auth.Identity) error {
	var api clusterTrustAPI = p.authClient
	transport, err := proxy.NewLeafTransport(proxy.LeafTransportConfig{
		Router: p.router,
		Identify: func(ctx context.Context, cert *ssh.Certificate) (*authz.Identity, error) {
			return srv.IdentifyRootUser(ctx, p.sshAccess, p.clusterName, p.clock, cert)
		},
		Nodes:       p.nodeWatcher,
		OpenSSHCert: p.authClient.OpenSSHRootUserCert,
		Locks:       p.locks,
		Deps:        p.deps(observe.ComponentLeaf, p.audit),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	// The leaf agents own their tunnels until shutdown: no caller's context.
	ctx, cancel := context.WithCancel(context.Background())
	l := &leafAgents{
		p: p, api: api, log: p.log.WithField("component", observe.ComponentLeafAgents), transport: transport,
		ctx: ctx, cancel: cancel, done: make(chan struct{}), agents: map[string]*leafAgent{},
	}
	go l.run()
	p.onShutdown(func(context.Context) error { return l.Close() })
	return nil
}

func (l *leafAgents) run() {
	defer close(l.done)
	for {
		l.reconcile()
		select {
		case <-l.ctx.Done():
			return
		case <-l.p.clock.After(leafReconcileInterval):
		}
	}
}

// Close stops the loop and every agent.
func (l *leafAgents) Close() error {
	l.cancel()
	<-l.done
	l.mu.Lock()
	agents := l.agents
	l.agents = map[string]*leafAgent{}
	l.mu.Unlock()
	for _, a := range agents {
		_ = a.agent.Close()
	}
	return nil
}

func (l *leafAgents) reconcile() {
	ctx, cancel := context.WithTimeout(l.ctx, 30*time.Second)
	defer cancel()
	tcs, err := l.api.GetTrustedClusters(ctx)
	if err != nil {
		l.log.WithError(err).Warn("Cannot read trusted clusters.")
		return
	}
	want := map[string]services.TrustedCluster{}
	for _, tc := range tcs {
		if tc.Spec.Enabled {
			want[tc.Metadata.Name] = tc
		}
	}
	l.mu.Lock()
	var stale []*leafAgent
	for name, a := range l.agents {
		if tc, ok := want[name]; !ok || tc.Spec.ProxyAddr != a.proxyAddr {
			stale = append(stale, a)
			delete(l.agents, name)
			l.log.WithField("root", name).Info("Trust in a root cluster ended: closing its tunnel.")
		}
	}
	var missing []services.TrustedCluster
	for name, tc := range want {
		if _, ok := l.agents[name]; !ok {
			missing = append(missing, tc)
		}
	}
	l.mu.Unlock()
	for _, a := range stale {
		_ = a.agent.Close()
	}
	for _, tc := range missing {
		a, err := l.startAgent(ctx, tc)
		if err != nil {
			l.log.WithError(err).WithField("root", tc.Metadata.Name).Warn("Cannot open a tunnel to a root cluster (retrying).")
			continue
		}
		l.mu.Lock()
		if l.ctx.Err() != nil {
			l.mu.Unlock()
			_ = a.agent.Close()
			return
		}
		l.agents[tc.Metadata.Name] = a
		l.mu.Unlock()
	}
}

// startAgent opens the tunnel to root tc: its proxy's tunnel address from
// its ping (which must answer as that cluster), checked against the
// root's host CA this cluster stored when trust was established.
func (l *leafAgents) startAgent(ctx context.Context, tc services.TrustedCluster) (*leafAgent, error) {
	name := tc.Metadata.Name
	ca, err := l.api.GetCertAuthority(ctx, name, services.HostCA, false)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	rootCAs, err := parseCAKeys(ca)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	ping, err := web.PingProxy(ctx, tc.Spec.ProxyAddr)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if ping.ClusterName != name {
		return nil, trace.BadParameter("the proxy at %s answers as cluster %q, not %q", tc.Spec.ProxyAddr, ping.ClusterName, name)
	}
	addr, err := tunnelAddrFor(tc.Spec.ProxyAddr, ping.TunnelAddr)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if l.signer == nil {
		if l.signer, err = l.newSigner(ctx); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	// A tunnel to every proxy of the root: the pool starts with the one
	// proxy_addr leads to and learns the others from the root's
	// announcements (their loopback or unspecified hosts read as
	// proxy_addr's host), as a node's pool does.
	resolve := func(announced string) (string, error) { return tunnelAddrFor(tc.Spec.ProxyAddr, announced) }
	agent, err := reversetunnel.NewPool(reversetunnel.AgentConfig{
		ProxyAddr: addr,
		Signer:    l.signer,
		HostCAs:   func() []ssh.PublicKey { return rootCAs },
		Handler:   l.handle,

		// The root's tunnel port must accept this process's lists.
		Algorithms: l.p.cfg.SSHAlgorithms(),
		Deps:       l.p.depsWith(observe.ComponentTunnelAgent, nil, logrus.Fields{"root": name}),
	}, resolve)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	agent.Start()
	l.log.WithFields(logrus.Fields{"root": name, "tunnel_addr": addr}).Info("Keeping a tunnel to a root cluster.")
	return &leafAgent{proxyAddr: tc.Spec.ProxyAddr, agent: agent}, nil
}

// newSigner makes a key and has this cluster's auth server certify it
// for leaf tunnels.
func (l *leafAgents) newSigner(ctx context.Context) (ssh.Signer, error) {
	priv, pub, err := utils.GenerateKeyPair()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	certBytes, err := l.api.GenerateLeafTunnelCert(ctx, pub)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	key, err := ssh.ParsePrivateKey(priv)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	pk, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cert, ok := pk.(*ssh.Certificate)
	if !ok {
		return nil, trace.BadParameter("auth returned no certificate for the leaf tunnel")
	}
	s, err := ssh.NewCertSigner(cert, key)
	return s, trace.Wrap(err)
}

// handle serves a transport channel a root proxy opened on a leaf
// tunnel: one LeafRequest, decided by this cluster (LeafTransport). It
// runs on the agent's goroutine for the channel, which the agent waits
// for when it closes; l.ctx ends the splice at shutdown.
func (l *leafAgents) handle(nc net.Conn) { l.transport.Serve(l.ctx, nc) }
