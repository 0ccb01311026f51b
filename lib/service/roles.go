package service

import (
	"context"
	"net"
	"sync"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/version"
	"golang.org/x/crypto/ssh"
)

// startHostRoles binds the node and proxy listeners, obtains their
// identities (principals need the bound addresses), then starts serving.
func (p *Process) startHostRoles(ctx context.Context) error {
	cfg := p.cfg
	var nodeLn, proxyLn net.Listener
	var nodeLim, proxyLim *limiter.ConnectionLimiter
	// A node behind NAT (proxy_server) opens no listening port.
	behindNAT := cfg.ProxyServer != ""
	if cfg.HasRole(config.RoleNode) && !behindNAT {
		ln, err := p.listen(ListenerNode, cfg.NodeAddr)
		if err != nil {
			return trace.Wrap(err)
		}
		if nodeLn, nodeLim, err = p.capListener(ListenerNode, ln, listenerCaps{perIP: -1, sshRefusal: true, descriptors: descriptorsPerNodeSession}); err != nil {
			return trace.Wrap(err)
		}
	}
	if cfg.HasRole(config.RoleProxy) {
		ln, err := p.listen(ListenerProxySSH, cfg.SSHAddr)
		if err != nil {
			return trace.Wrap(err)
		}
		if proxyLn, proxyLim, err = p.capListener(ListenerProxySSH, ln, listenerCaps{sshRefusal: true, withRate: true, descriptors: descriptorsPerProxySession}); err != nil {
			return trace.Wrap(err)
		}
	}
	var err error
	var nodeID, proxyID *auth.Identity
	var tn *tunnelNode
	if behindNAT {
		// Joined through the proxy's join relay; no address, no extra
		// principals (nothing dials it).
		if nodeID, err = p.hostIdentity(ctx, auth.RoleNode, "", nil); err != nil {
			return trace.Wrap(err)
		}
		if tn, err = p.startTunnelAgent(ctx, nodeID); err != nil {
			return trace.Wrap(err)
		}
		p.tunnelAgent = tn.agent
	}
	if nodeLn != nil {
		principals := appendUnique(listenIPs(nodeLn.Addr()), hostOf(advertisedAddr(nodeLn.Addr())))
		if nodeID, err = p.hostIdentity(ctx, auth.RoleNode, advertisedAddr(nodeLn.Addr()), principals); err != nil {
			return trace.Wrap(err)
		}
	}
	if proxyLn != nil {
		// The proxy's principals are its public names, the cluster name
		// and its listen IPs, loopback included, so that `ssh -J
		// 127.0.0.1:3023` verifies against the host CA. The hosts of the
		// other listen addresses count too: a node told to reach
		// `tunnel_addr: 10.0.0.5:3024` checks the proxy's certificate for
		// 10.0.0.5 (a wildcard one adds nothing beyond the interfaces).
		principals := appendUnique(listenIPs(proxyLn.Addr()), "127.0.0.1", "::1", "localhost", cfg.ClusterName)
		for _, a := range append([]string{cfg.TunnelAddr, cfg.WebAddr, cfg.PeerAddr}, cfg.PublicAddrs...) {
			if h := explicitHost(a); h != "" {
				principals = appendUnique(principals, h)
			}
		}
		if proxyID, err = p.hostIdentity(ctx, auth.RoleProxy, "", principals); err != nil {
			return trace.Wrap(err)
		}
	}
	// A remote proxy's rights (list and watch nodes) include a node's, so
	// the proxy identity talks to auth when both roles run here.
	clientID := proxyID
	if clientID == nil {
		clientID = nodeID
	}
	if clientID == nil {
		return nil
	}
	p.clusterName = clientID.ClusterName
	if p.authClient, err = p.authClientFor(clientID); err != nil {
		return trace.Wrap(err)
	}
	if err := p.openAudit(); err != nil {
		return trace.Wrap(err)
	}
	if err := p.startLocks(ctx); err != nil {
		return trace.Wrap(err)
	}
	if err := p.startAccessCache(ctx); err != nil {
		return trace.Wrap(err)
	}
	if nodeID != nil {
		// The node's own calls (heartbeat, recording uploads, its
		// networking watch) go as the node: auth takes a session's
		// chunks only from a node identity.
		clt, err := p.authClientFor(nodeID)
		if err != nil {
			return trace.Wrap(err)
		}
		if err := p.startNode(ctx, nodeLn, nodeLim, nodeID, clt, tn); err != nil {
			return trace.Wrap(err)
		}
	}
	if proxyLn != nil {
		if err := p.startProxy(ctx, proxyLn, proxyLim, proxyID, p.authClient); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

func hostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// explicitHost is the host of a listen or public address, "" for none
// or a wildcard (0.0.0.0, ::, an empty host).
func explicitHost(hostport string) string {
	h := hostOf(hostport)
	if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
		return ""
	}
	return h
}

// nodeRecord is the node's inventory record, guarded so that a future
// label reload can change it while heartbeats and connections read it.
type nodeRecord struct {
	mu   sync.Mutex
	node services.Node
}

func (r *nodeRecord) get() services.Node {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.node
	return n
}

// startNode serves the node's SSH port (or, behind NAT, the connections
// its tunnel brings: ln is nil and tn set) and heartbeats into the
// inventory.
func (p *Process) startNode(ctx context.Context, ln net.Listener, lim *limiter.ConnectionLimiter, id *auth.Identity, clt *auth.Client, tn *tunnelNode) error {
	node := services.Node{
		UUID:     p.hostUUID,
		Hostname: p.cfg.NodeName,
		Labels:   p.cfg.Labels,
		Cluster:  p.clusterName,
		Version:  version.Version,
	}
	if ln != nil {
		node.Addr = advertisedAddr(ln.Addr())
	} else {
		// Asked for by the node and granted by auth only with no
		// address: reachable over its tunnel alone.
		node.Tunnel = true
	}
	rec := &nodeRecord{node: node}
	if err := p.checkNodeRecord(rec.node); err != nil {
		return trace.Wrap(err)
	}
	recorder, err := p.startRecordingUploads(clt)
	if err != nil {
		return trace.Wrap(err)
	}
	scfg := srv.Config{
		Recorder:    recorder,
		ClusterName: p.clusterName,
		HostSigners: []ssh.Signer{id.SSHSigner},
		Algorithms:  p.cfg.SSHAlgorithms(),
		AccessPoint: p.sshAccess,
		GetNode:     rec.get,
		IdleTimeout: p.cfg.Limits.IdleTimeout,
		Locks:       p.locks,
		Deps:        p.deps(observe.ComponentNode, p.audit),
	}
	// Behind NAT there is no listener and so no listener's limiter: the
	// proxy's caps apply to every connection before it reaches the
	// tunnel. (A nil *ConnectionLimiter must not become a non-nil
	// interface.)
	if lim != nil {
		scfg.Limiter = lim
	}
	server, err := srv.New(scfg)
	if err != nil {
		return trace.Wrap(err)
	}
	p.nodeServer = server
	if ln != nil {
		p.goServe("node SSH", func() error { return ignoreClosed(server.Serve(ln)) })
	} else {
		tn.audit.Store(p.audit)
		tn.server.Store(server)
	}
	p.onShutdown(server.Shutdown)

	hb, err := auth.NewHeartbeat(auth.HeartbeatConfig{
		Announcer: clt,
		GetNode:   rec.get,
		Deps:      p.deps(observe.ComponentHeartbeat, nil),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.heartbeat = hb
	p.goServe("heartbeat", hb.Run)
	p.onShutdown(func(context.Context) error { return hb.Close() })
	if ln != nil {
		p.log.WithField("addr", ln.Addr().String()).Info("Node SSH server is serving.")
	} else {
		p.log.Info("Node SSH server is serving over its reverse tunnel (no listening port).")
	}
	return nil
}

// checkNodeRecord refuses to start a node whose own record every
// heartbeat would have refused (a label with a control character, a
// hostname a joined node may not take): one clear line at start-up instead
// of a warning every interval and a node missing from routing. The naming
// rules are those the auth server applies to joined nodes; the auth
// server's own host is exempt from them (auth.ServerConfig.HostUUID).
func (p *Process) checkNodeRecord(n services.Node) error {
	if err := n.CheckAndSetDefaults(); err != nil {
		return trace.BadParameter("this node's record: %v (check --nodename and --labels)", trace.UserMessage(err))
	}
	if p.authServer == nil {
		if err := services.CheckHostnameShape(n.Hostname, n.UUID, n.Addr, []string{p.clusterName}); err != nil {
			return trace.BadParameter("%v (set --nodename)", trace.UserMessage(err))
		}
	}
	return nil
}
