package service

import (
	"context"
	"net"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/proxy/health"
	"github.com/postern-dev/postern/lib/proxy/sshproxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/web"
)

// startProxy builds the process's one NodeWatcher and one Router and serves
// the proxy SSH port and the web port with them. Both listeners route
// through the same Router object: nothing in this process dials its own
// proxy port.
func (p *Process) startProxy(ctx context.Context, ln net.Listener, lim *limiter.ConnectionLimiter, id *auth.Identity, clt *auth.Client) error {
	nw, err := services.NewNodeWatcher(services.NodeWatcherConfig{
		Events: clt,
		Clock:  p.clock,
		Logger: p.log.WithField("component", observe.ComponentNodeWatcher),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.nodeWatcher = nw
	if err := registerNodeWatcherMetrics(p.registry, nw); err != nil {
		return trace.Wrap(err)
	}
	p.onShutdown(func(context.Context) error { return nw.Close() })
	// OpenSSH nodes do not heartbeat: this proxy checks them itself, with
	// the host CA from its in-memory access cache.
	hc, err := health.New(health.Config{
		ClusterName: p.clusterName, Nodes: nw, CAs: p.sshAccess,
		Deps: p.deps(observe.ComponentHealth, nil),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.onShutdown(func(context.Context) error { return hc.Close() })
	p.openSSHHealth = hc

	// The networking config is read on every route. It is served from
	// memory, kept current by the auth API's networking watch (a change
	// applies as soon as its event lands, milliseconds).
	networking, err := services.NewNetworkingWatcher(services.NetworkingWatcherConfig{
		Events: clt.NetworkingEvents(),
		Clock:  p.clock,
		Logger: p.log.WithField("component", observe.ComponentNetWatcher),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.onShutdown(func(context.Context) error { return networking.Close() })
	ts, tunnelAddr, err := p.startTunnelServer(id, networking)
	if err != nil {
		return trace.Wrap(err)
	}
	p.tunnelServer = ts
	peers, peerAddr, err := p.startPeering(id, ts)
	if err != nil {
		return trace.Wrap(err)
	}
	p.peerAddr = peerAddr
	router, err := proxy.NewRouter(proxy.RouterConfig{
		Tunnels:     ts,
		Peers:       peers,
		ClusterName: p.clusterName,
		NodeWatcher: nw,
		Networking:  networking,
		Locks:       p.locks,
		Health:      hc,
		// A root routes to its leaves over their tunnels (leaf.go).
		Leaves:         p.leafTunnels(),
		RemoteClusters: p.remoteClusterLister(id),
		Deps:           p.deps(observe.ComponentRouter, nil),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.router = router
	// A leaf keeps tunnels to the roots it trusts and serves their
	// routing requests with this Router (leaf.go).
	if err := p.startLeafAgents(id); err != nil {
		return trace.Wrap(err)
	}
	handler, err := sshproxy.New(sshproxy.Config{
		Router:     router,
		Nodes:      nw,
		Recordings: clt,
		Requests:   clt,
		Locks:      p.locks,
		Deps:       p.deps(observe.ComponentProxySSH, p.audit),
		// psh's per-session certificates (require_session_mfa).
		SessionCerts: clt,
	})
	if err != nil {
		return trace.Wrap(err)
	}
	server, err := srv.New(srv.Config{
		ClusterName: p.clusterName,
		HostSigners: []ssh.Signer{id.SSHSigner},
		Algorithms:  p.cfg.SSHAlgorithms(),
		AccessPoint: p.sshAccess,
		Proxy:       handler,
		Limiter:     lim,
		IdleTimeout: p.cfg.Limits.IdleTimeout,
		Locks:       p.locks,
		Deps:        p.deps(observe.ComponentProxySSH, p.audit),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.proxySSH = server
	p.goServe("proxy SSH", func() error { return ignoreClosed(server.Serve(ln)) })
	p.drainers = append(p.drainers, server.Shutdown)
	p.log.WithField("addr", ln.Addr().String()).Info("Proxy SSH server is serving.")

	rec, err := p.startProxyRecorder(clt, networking)
	if err == nil {
		err = p.startWeb(ln.Addr(), tunnelAddr, id, clt, rec)
	}
	// Registered whether or not the web port came up, so the SSH server
	// is shut down either way.
	p.onShutdown(p.drainFrontends)
	if p.stopPeering != nil {
		p.onShutdown(p.stopPeering)
	}
	if err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(p.startProxyHeartbeat(tunnelAddr))
}

// startWeb serves the proxy's HTTPS port. Logins, browser sessions, the
// second-factor hint and recordings go to auth through clt, the proxy's
// client: session records live in the backend, so that any proxy serves
// any browser and a logout on one ends the session on all
// (lib/web/sessionshared.go). rec records the terminals to OpenSSH nodes.
func (p *Process) startWeb(sshAddr net.Addr, tunnelAddr string, id *auth.Identity, clt *auth.Client, rec *web.TerminalRecorder) error {
	raw, err := p.listen(ListenerWeb, p.cfg.WebAddr)
	if err != nil {
		return trace.Wrap(err)
	}
	ln, _, err := p.capListener(ListenerWeb, raw, listenerCaps{withRate: true})
	if err != nil {
		return trace.Wrap(err)
	}
	hosts := appendUnique(listenIPs(ln.Addr()), p.cfg.NodeName)
	for _, a := range p.cfg.PublicAddrs {
		hosts = appendUnique(hosts, hostOf(a))
	}
	pair, err := web.LoadOrCreateTLS(p.cfg.WebTLSDir(), p.cfg.WebCert, p.cfg.WebKey, hosts, p.clock.Now())
	if err != nil {
		ln.Close()
		return trace.Wrap(err)
	}
	wcfg := web.Config{
		ClusterName:  p.clusterName,
		ProxySSHAddr: advertisedAddr(sshAddr),
		TunnelAddr:   tunnelAddr,
		// Hosts that reach only this proxy join through it; the proxy
		// opens the auth side as itself and names the client.
		JoinRelay: func(ctx context.Context, client string) (net.Conn, error) {
			raw, err := clt.DialRelay(ctx)
			if err != nil {
				return nil, trace.Wrap(err)
			}
			return auth.DialJoinRelay(ctx, raw, id, client)
		},
		Certificate:    pair,
		PublicWebAddrs: publicWebAddrs(p.cfg.PublicAddrs, ln.Addr(), hosts),
		SSHAlgorithms:  p.cfg.SSHAlgorithms(),
		Auth:           clt,
		SecondFactor:   web.CachedSecondFactor(clt, p.clock),
		Deps:           p.deps(observe.ComponentWeb, nil),
	}
	// Browser sessions and the terminal use this process's Router and
	// NodeWatcher; their records are auth's.
	wcfg.WebSessions = web.WebSessionsConfig{
		Router: p.router, Nodes: p.nodeWatcher, Locks: p.locks, Audit: p.audit,
		Roles: clt, Store: &web.AuthSessionStore{Auth: clt}, Certs: clt, Watch: clt.WebSessionEvents,
		Recordings: clt, Recorder: rec, AccessRequests: clt,
	}
	// Leaf clusters in the web UI (leaf.go).
	wcfg.WebSessions.Clusters, wcfg.WebSessions.LeafHostCAs = p.router, p.leafHostCAs(id)
	if g := p.cfg.WebTerminalGrace; g != nil {
		// web: zero means the default, negative none.
		wcfg.WebSessions.TerminalGrace = *g
		if *g == 0 {
			wcfg.WebSessions.TerminalGrace = -1
		}
	}
	ws, err := web.NewServer(wcfg)
	if err != nil {
		ln.Close()
		return trace.Wrap(err)
	}
	p.goServe("web", func() error { return ws.Serve(ln) })
	p.drainers = append(p.drainers, ws.Shutdown)
	p.log.WithField("addr", ln.Addr().String()).Info("Web server is serving.")
	return nil
}

// publicWebAddrs lists the addresses browsers may reach the web port at,
// the preferred first: each public_addrs entry (one without a port is
// the web port, or 443 behind a load balancer), then the listener's own
// address and the names in its certificate. A single sign-on redirect
// URI names one of these, never a Host header a client made up.
func publicWebAddrs(public []string, listen net.Addr, hosts []string) []string {
	_, port, err := net.SplitHostPort(listen.String())
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range public {
		if _, _, err := net.SplitHostPort(a); err == nil {
			out = appendUnique(out, a)
			continue
		}
		h := strings.Trim(a, "[]")
		out = appendUnique(out, net.JoinHostPort(h, port))
		if strings.Contains(h, ":") {
			h = "[" + h + "]"
		}
		out = appendUnique(out, h)
	}
	out = appendUnique(out, advertisedAddr(listen))
	for _, h := range hosts {
		out = appendUnique(out, net.JoinHostPort(h, port))
	}
	return out
}
