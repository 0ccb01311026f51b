package auth

import (
	"context"
	"net/http"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// Tunnel locations (several proxies): a proxy
// writes a short lease for each reverse tunnel it holds, and every proxy
// watches them. The proxy named in a lease is always the caller's
// certificate ID: a proxy can claim tunnels only for itself, never make
// its peers send another proxy's users to it, nor erase another proxy's
// claim.

// UpsertTunnelConnections writes or renews the leases of proxyID for
// req.NodeUUIDs, each valid for services.DefaultTunnelConnectionTTL on the
// auth server's clock.
func (s *Server) UpsertTunnelConnections(ctx context.Context, proxyID string, req authapi.TunnelConnectionsRequest) error {
	if err := checkTunnelConnectionsRequest(proxyID, req); err != nil {
		return trace.Wrap(err)
	}
	now := s.clock.Now().UTC()
	for _, node := range req.NodeUUIDs {
		tc := services.TunnelConnection{
			NodeUUID: node, ProxyUUID: proxyID, PeerAddr: req.PeerAddr,
			LastSeen: now, Expires: now.Add(services.DefaultTunnelConnectionTTL),
		}
		if err := s.store.UpsertTunnelConnection(ctx, tc); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// DeleteTunnelConnections removes proxyID's leases for req.NodeUUIDs; a
// lease that already lapsed is no error.
func (s *Server) DeleteTunnelConnections(ctx context.Context, proxyID string, req authapi.TunnelConnectionsRequest) error {
	if err := checkTunnelConnectionsRequest(proxyID, req); err != nil {
		return trace.Wrap(err)
	}
	for _, node := range req.NodeUUIDs {
		if err := s.store.DeleteTunnelConnection(ctx, node, proxyID); err != nil && !trace.IsNotFound(err) {
			return trace.Wrap(err)
		}
	}
	return nil
}

func checkTunnelConnectionsRequest(proxyID string, req authapi.TunnelConnectionsRequest) error {
	if req.ProxyUUID != "" && req.ProxyUUID != proxyID {
		return trace.AccessDenied("proxy %q may not write tunnel connections for proxy %q", proxyID, req.ProxyUUID)
	}
	if n := len(req.NodeUUIDs); n > authapi.MaxTunnelConnectionsPerRequest {
		return trace.BadParameter("tunnel connections: %d nodes in one request, at most %d", n, authapi.MaxTunnelConnectionsPerRequest)
	}
	return nil
}

func (a *APIServer) upsertTunnelConnections(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.TunnelConnectionsRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.UpsertTunnelConnections(ctx, p.ID, req))
}

func (a *APIServer) deleteTunnelConnections(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.TunnelConnectionsRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.Wrap(a.auth.DeleteTunnelConnections(ctx, p.ID, req))
}

func (a *APIServer) getTunnelConnections(ctx context.Context, _ *peer, _ *http.Request) (any, error) {
	tcs, err := a.auth.store.GetTunnelConnections(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if tcs == nil {
		tcs = []services.TunnelConnection{}
	}
	return tcs, nil
}

func (a *APIServer) watchTunnelConnections(w http.ResponseWriter, r *http.Request, p *peer) {
	a.watchPrefix(w, r, p, services.TunnelConnectionsPrefix())
}

// UpsertTunnelConnections writes or renews this proxy's leases.
func (c *Client) UpsertTunnelConnections(ctx context.Context, req authapi.TunnelConnectionsRequest) error {
	return trace.Wrap(c.do(ctx, http.MethodPost, "/v1/tunnel_connections", nil, req, nil))
}

// DeleteTunnelConnections removes this proxy's leases.
func (c *Client) DeleteTunnelConnections(ctx context.Context, req authapi.TunnelConnectionsRequest) error {
	return trace.Wrap(c.do(ctx, http.MethodPost, "/v1/tunnel_connections/delete", nil, req, nil))
}

// TunnelConnectionEvents returns the auth API as a source for a
// services.TunnelLocator.
func (c *Client) TunnelConnectionEvents() services.TunnelConnectionEvents {
	return tunnelConnectionEvents{c}
}

type tunnelConnectionEvents struct{ c *Client }

func (e tunnelConnectionEvents) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	return e.c.newWatcher(ctx, "/v1/watch/tunnel_connections", watch)
}

func (e tunnelConnectionEvents) GetTunnelConnections(ctx context.Context) ([]services.TunnelConnection, error) {
	return e.c.GetTunnelConnections(ctx)
}

// GetTunnelConnections lists the live tunnel leases (proxies and admins).
func (c *Client) GetTunnelConnections(ctx context.Context) ([]services.TunnelConnection, error) {
	var out []services.TunnelConnection
	if err := c.do(ctx, http.MethodGet, "/v1/tunnel_connections", nil, nil, &out); err != nil {
		return nil, trace.Wrap(err)
	}
	return out, nil
}
