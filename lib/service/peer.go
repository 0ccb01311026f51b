package service

import (
	"context"
	"crypto/x509"
	"net"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy/peer"
	"github.com/postern-dev/postern/lib/reversetunnel"
	"github.com/postern-dev/postern/lib/services"
)

// ListenerPeer is the proxy's peering port.
const ListenerPeer = "peer"

// startPeering serves the peer port with this proxy's TLS identity, keeps
// a tunnel_connection lease for every tunnel on ts, and returns the peer
// client the Router dials other proxies' tunnels with, and the peer
// address this proxy advertises.
//
// Shutdown order: stopPeering (registered by startProxy to run before
// the SSH and web ports drain) deletes this proxy's leases and refuses
// new peered dials, so peers send new sessions to the node's other
// tunnel (the agents were asked to move); dials already open through the
// peer server go on until the peer server's own Shutdown, which waits
// for them within the grace, before the tunnel server closes.
func (p *Process) startPeering(id *auth.Identity, ts *reversetunnel.Server) (*peer.Client, string, error) {
	ident := peer.Identity{
		UUID:        id.ID,
		ClusterName: p.clusterName,
		Certificate: id.TLSCert,
		CAPool:      func() *x509.CertPool { return id.TLSCAPool },
	}
	loc, err := services.NewTunnelLocator(services.TunnelLocatorConfig{
		Events: p.authClient.TunnelConnectionEvents(),
		Clock:  p.clock,
		Logger: p.log.WithField("component", observe.ComponentTunnelLocator),
	})
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	p.onShutdown(func(context.Context) error { return loc.Close() })

	raw, err := p.listen(ListenerPeer, p.cfg.PeerAddr)
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	// A peer proxy holds one connection (its streams ride it), so the
	// per-address cap is the config's; TLS: refused without a word.
	ln, _, err := p.capListener(ListenerPeer, raw, listenerCaps{withRate: true, handshakes: true})
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	srv, err := peer.NewServer(peer.ServerConfig{
		Identity: ident,
		Tunnels:  peerTunnels{ts: ts, leaves: p.leaves},
		// Zero: peer.DefaultHandshakeTimeout.
		HandshakeTimeout: p.cfg.Limits.HandshakeTimeout,
		Deps:             p.deps(observe.ComponentPeerServer, p.audit),
	})
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	p.goServe("peer", func() error {
		if err := srv.Serve(ln); err != nil && err != peer.ErrServerClosed {
			return trace.Wrap(err)
		}
		return nil
	})
	p.onShutdown(srv.Shutdown)
	addr := advertisedAddr(ln.Addr())
	p.log.WithField("addr", ln.Addr().String()).Info("Peer server is serving.")

	client, err := peer.NewClient(peer.ClientConfig{
		Identity: ident,
		Locator:  loc,
		Deps:     p.deps(observe.ComponentPeerClient, p.audit),
	})
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	p.onShutdown(func(context.Context) error { return client.Close() })

	kcfg := peer.LeaseKeeperConfig{
		Tunnels:  ts,
		Writer:   p.authClient,
		PeerAddr: addr,
		Deps:     p.deps(observe.ComponentPeerLeases, nil),
	}
	if p.leaves != nil {
		kcfg.Leaves = p.leaves
	}
	keeper, err := peer.NewLeaseKeeper(kcfg)
	if err != nil {
		return nil, "", trace.Wrap(err)
	}
	// Run early in the shutdown (startProxy registers it after the
	// frontends' drain): the leases go and peers are told to dial
	// elsewhere before sessions drain, so no new peered session lands on
	// a tunnel that is about to move.
	p.stopPeering = func(ctx context.Context) error {
		err := keeper.Close(ctx)
		srv.StopAccepting()
		return err
	}
	p.onShutdown(keeper.Close)
	return client, addr, nil
}

// peerTunnels is what the peer server dials: a node's tunnel by its UUID,
// a leaf cluster's by services.LeafTunnelID (only one whose tunnel is
// here: the peer server checks HasTunnel first).
type peerTunnels struct {
	ts     *reversetunnel.Server
	leaves *reversetunnel.Leaves
}

func (t peerTunnels) HasTunnel(id string) bool {
	if leaf, ok := services.LeafOfTunnelID(id); ok {
		return t.leaves.HasLeaf(leaf)
	}
	return t.ts.HasTunnel(id)
}

func (t peerTunnels) DialTunnel(ctx context.Context, id, source, destination string) (net.Conn, error) {
	if leaf, ok := services.LeafOfTunnelID(id); ok {
		conn, err := t.leaves.DialLeaf(ctx, leaf, source, destination)
		return conn, trace.Wrap(err)
	}
	conn, err := t.ts.DialTunnel(ctx, id, source, destination)
	return conn, trace.Wrap(err)
}
