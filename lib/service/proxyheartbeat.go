package service

import (
	"context"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/version"
)

// proxyRecord is this proxy's own `proxy` resource as it heartbeats it.
func (p *Process) proxyRecord(tunnelAddr string) services.Proxy {
	rec := services.Proxy{
		UUID:       p.hostUUID,
		Hostname:   p.cfg.NodeName,
		Cluster:    p.clusterName,
		TunnelAddr: tunnelAddr,
		Version:    version.Version,
		PeerAddr:   p.peerAddr,
	}
	if a := p.Addr(ListenerProxySSH); a != nil {
		rec.SSHAddr = advertisedAddr(a)
	}
	if a := p.Addr(ListenerWeb); a != nil {
		rec.WebAddr = advertisedAddr(a)
	}
	return rec
}

// getProxies lists the cluster's live proxies, this one included once its
// first heartbeat landed.
func (p *Process) getProxies(ctx context.Context) ([]services.Proxy, error) {
	out, err := p.authClient.GetProxies(ctx)
	return out, trace.Wrap(err)
}

// startProxyHeartbeat announces this proxy's record now and every
// heartbeat interval, with the same TTL rules as a node's, and removes it
// on a clean shutdown so that agents and peers stop dialing it at once.
func (p *Process) startProxyHeartbeat(tunnelAddr string) error {
	rec := p.proxyRecord(tunnelAddr)
	if err := rec.CheckAndSetDefaults(); err != nil {
		return trace.BadParameter("this proxy's record: %v (check --nodename)", trace.UserMessage(err))
	}
	hb, err := auth.NewHeartbeat(auth.HeartbeatConfig{
		Announce: func(ctx context.Context, last, expires time.Time) error {
			r := rec
			r.LastHeartbeat, r.Expires = last, expires
			if p.openSSHHealth != nil {
				r.OfflineOpenSSH = p.openSSHHealth.Offline()
			}
			return trace.Wrap(p.authClient.UpsertProxy(ctx, r), "proxy %q", r.UUID)
		},
		Deps: p.depsWith(observe.ComponentHeartbeat, nil, logrus.Fields{"role": "proxy"}),
	})
	if err != nil {
		return trace.Wrap(err)
	}
	p.proxyHeartbeat = hb
	p.goServe("proxy heartbeat", hb.Run)
	// Make before break, first half: after the record is gone (below)
	// and before the SSH and web servers drain, the tunnel agents are
	// asked to open tunnels to other proxies; the tunnel server itself
	// closes last.
	if ts := p.tunnelServer; ts != nil {
		p.onShutdown(func(context.Context) error { ts.AskToMove(); return nil })
	}
	// Registered before the servers' shutdowns run (closers run in
	// reverse), so the record goes first: nobody new is sent here while
	// this proxy drains.
	p.onShutdown(func(ctx context.Context) error {
		_ = hb.Close()
		<-hb.Done()
		err := p.authClient.DeleteProxy(ctx)
		if err != nil && !trace.IsNotFound(err) {
			p.log.WithError(err).Warn("Could not remove this proxy's record; it expires at its TTL.")
		}
		return nil
	})
	return nil
}

// ProxyHeartbeat is the proxy's heartbeat (nil when not a proxy): tests
// wait on Announced for the first record.
func (p *Process) ProxyHeartbeat() *auth.Heartbeat { return p.proxyHeartbeat }
