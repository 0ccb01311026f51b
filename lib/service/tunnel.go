package service

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/reversetunnel"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/web"
)

// ListenerTunnel is the proxy's reverse tunnel port.
const ListenerTunnel = "tunnel"

// tunnelStartTimeout bounds how long a node behind NAT waits at start for
// its first tunnel: everything it does next (the access point, the
// heartbeat) goes through it.
const tunnelStartTimeout = 30 * time.Second

// signerCA is the host CA that signed id's own host certificate. A host
// trusts exactly that CA on the tunnel: its certificate came from the
// join the CA pin authenticated (or from the local auth server), so a
// proxy or node of this cluster is one the same CA signed, and a host of
// another cluster is not.
func signerCA(id *auth.Identity) func() []ssh.PublicKey {
	ca := id.SSHCert.SignatureKey
	return func() []ssh.PublicKey { return []ssh.PublicKey{ca} }
}

// dialAuthAPI connects to the auth API on behalf of a tunnel node: a raw
// stream its own TLS runs over, to an auth server that answers this proxy
// (auth.Client.DialRelay: a frozen auth server must not hold every tunnel
// node's calls), or in memory to the auth server of this process.
func (p *Process) dialAuthAPI(ctx context.Context) (net.Conn, error) {
	nc, err := p.authClient.DialRelay(ctx)
	return nc, trace.Wrap(err)
}

// startTunnelServer serves the proxy's tunnel port with the proxy's host
// identity.
func (p *Process) startTunnelServer(id *auth.Identity, networking proxy.NetworkingGetter) (*reversetunnel.Server, string, error) {
	raw, err := p.listen(ListenerTunnel, p.cfg.TunnelAddr)
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	// No per-address cap on what is open (a site of nodes behind one NAT
	// holds its tunnels and a data connection per session from one
	// address); what an address holds unauthenticated is capped by the
	// handshake caps, and the rate spent only by connections that never
	// authenticate. The tunnel port speaks SSH: a refused agent reads why.
	ln, _, err := p.capListener(ListenerTunnel, raw, listenerCaps{perIP: -1, sshRefusal: true, withRate: true, handshakes: true})
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	leaves, err := p.newLeaves(id)
	if err != nil {
		ln.Close()
		return nil, "", trace.Wrap(err)
	}
	ts, err := reversetunnel.NewServer(reversetunnel.ServerConfig{
		HostSigner: id.SSHSigner,
		Algorithms: p.cfg.SSHAlgorithms(),
		HostCAs:    signerCA(id),
		DialAuth:   p.dialAuthAPI,
		// Zero: reversetunnel.DefaultHandshakeTimeout.
		HandshakeTimeout: p.cfg.Limits.HandshakeTimeout,
		KeepAlive:        tunnelKeepAlive(networking),
		Proxies:          p.announcedProxies,
		Self:             reversetunnel.AnnouncedProxy{UUID: p.hostUUID, TunnelAddr: advertisedAddr(ln.Addr())},
		Leaves:           leaves,
		Deps:             p.deps(observe.ComponentTunnelServer, p.audit),
	})
	if err != nil {
		ln.Close()
		return nil, "", trace.Wrap(err)
	}
	p.goServe("tunnel", func() error {
		if err := ts.Serve(ln); err != nil && err != reversetunnel.ErrServerClosed {
			return trace.Wrap(err)
		}
		return nil
	})
	// Runs last of the proxy's closers: by then AskToMove has sent the
	// agents elsewhere (see startProxyHeartbeat) and the sessions on the
	// tunnels have drained.
	p.onShutdown(ts.Shutdown)
	p.log.WithField("addr", ln.Addr().String()).Info("Reverse tunnel server is serving.")
	return ts, advertisedAddr(ln.Addr()), nil
}

// tunnelKeepAlive reads the cluster's tunnel keep-alive settings from the
// (in-memory, watched) networking config: a change applies to live
// tunnels on both ends from their next probe.
func tunnelKeepAlive(networking proxy.NetworkingGetter) func() (time.Duration, int) {
	return func() (time.Duration, int) {
		// Called from a keep-alive loop between probes, no request's context to take.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		c, err := networking.GetClusterNetworkingConfig(ctx)
		if err != nil {
			return 0, 0
		}
		return c.Spec.KeepAliveInterval.Value(), c.Spec.KeepAliveCountMax
	}
}

// announcedProxies is the proxy list the tunnel server announces to its
// agents: every live proxy with a tunnel address.
func (p *Process) announcedProxies(ctx context.Context) ([]reversetunnel.AnnouncedProxy, error) {
	list, err := p.getProxies(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := make([]reversetunnel.AnnouncedProxy, 0, len(list))
	for _, x := range list {
		if x.TunnelAddr != "" {
			out = append(out, reversetunnel.AnnouncedProxy{UUID: x.UUID, TunnelAddr: x.TunnelAddr})
		}
	}
	return out, nil
}

// tunnelNode is a node behind NAT: its agent, and the node server the
// agent hands connections to once it exists.
type tunnelNode struct {
	agent  *reversetunnel.Pool
	server atomic.Pointer[srv.Server]
	// audit is the node's audit log once open (after the first tunnel:
	// the log ships through it); refusals before that are logged only.
	audit atomic.Pointer[events.Log]
}

// Emit records the agent's refusals in the node's audit log.
func (t *tunnelNode) Emit(ctx context.Context, e events.Event) {
	if l := t.audit.Load(); l != nil {
		l.Emit(ctx, e)
	}
}

func (t *tunnelNode) handle(nc net.Conn) {
	s := t.server.Load()
	if s == nil {
		// Not serving yet (still starting): the proxy's banner check
		// fails the dial cleanly.
		_ = nc.Close()
		return
	}
	s.HandleConn(nc)
}

// tunnelAddrFor is where the node dials the proxy's tunnel port: the
// address the proxy announces in /webapi/ping, with an unspecified host
// replaced by the host the node was given (--proxy-server), which the
// proxy's host certificate names, and a loopback one too unless that
// host is loopback as well: a proxy on another machine means its own
// loopback, a proxy on this one (127.0.0.7 while proxy_server is
// 127.0.0.1) exactly the address it announced.
func tunnelAddrFor(proxyServer, announced string) (string, error) {
	host, _, err := net.SplitHostPort(proxyServer)
	if err != nil {
		return "", trace.BadParameter("proxy_server %q: %v", proxyServer, err)
	}
	if announced == "" {
		return "", trace.BadParameter("the proxy at %s takes no reverse tunnels", proxyServer)
	}
	ah, port, err := net.SplitHostPort(announced)
	if err != nil {
		return "", trace.BadParameter("the proxy at %s announced a bad tunnel address %q", proxyServer, announced)
	}
	if ip := net.ParseIP(ah); ah == "" || (ip != nil && (ip.IsUnspecified() || (ip.IsLoopback() && !isLoopbackHost(host)))) {
		ah = host
	}
	return net.JoinHostPort(ah, port), nil
}

// isLoopbackHost reports whether host is a loopback IP or localhost.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// startTunnelAgent connects a node behind NAT to its proxy and waits for
// the first tunnel.
func (p *Process) startTunnelAgent(ctx context.Context, id *auth.Identity) (*tunnelNode, error) {
	pctx, cancel := context.WithTimeout(ctx, tunnelStartTimeout)
	defer cancel()
	ping, err := web.PingProxy(pctx, p.cfg.ProxyServer)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	addr, err := tunnelAddrFor(p.cfg.ProxyServer, ping.TunnelAddr)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	tn := &tunnelNode{}
	// Every proxy announced over a tunnel gets a tunnel of its own, at
	// the address it announced (its loopback or unspecified host read as
	// the host this node was given).
	resolve := func(announced string) (string, error) { return tunnelAddrFor(p.cfg.ProxyServer, announced) }
	agent, err := reversetunnel.NewPool(reversetunnel.AgentConfig{
		ProxyAddr: addr,
		Signer:    id.SSHSigner,
		HostCAs:   signerCA(id),
		Handler:   tn.handle,

		// What the proxy's tunnel port offers when both run this config.
		Algorithms: p.cfg.SSHAlgorithms(),
		Deps:       p.deps(observe.ComponentTunnelAgent, tn),
	}, resolve)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	agent.Start()
	p.onShutdown(func(context.Context) error { return agent.Close() })
	tn.agent = agent
	if err := agent.WaitConnected(pctx); err != nil {
		return nil, trace.Wrap(err, "no reverse tunnel to the proxy at %s", addr)
	}
	p.log.WithField("proxy", addr).Info("Reverse tunnel to the proxy is up.")
	return tn, nil
}
