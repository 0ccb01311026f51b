package auth

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// The access watch feeds the services.AccessCache of a proxy or node
// whose auth server is elsewhere: role and CA events over one stream, so
// that their SSH servers check certificates and roles from memory (no
// auth API round trip per connection) and still learn of a role edit or a
// CA change within the stream's latency. CA records are sent without
// their private keys: the stream never carries a secret.

// watchAccess streams role, certificate authority and trusted_cluster
// events (a leaf's SSH servers decide from the trusted_cluster whether a
// root's user is accepted and with which roles).
func (a *APIServer) watchAccess(w http.ResponseWriter, r *http.Request, p *peer) {
	a.watchRoots(w, r, p, stripCASecrets, services.RolesPrefix(), services.AuthoritiesPrefix(), services.TrustedClustersPrefix())
}

// stripCASecrets re-encodes a CA record without its private keys and a
// trusted_cluster without its token; other records pass unchanged. A
// record that does not decode is refused rather than passed on with its
// secrets.
func stripCASecrets(key string, value []byte) ([]byte, error) {
	if services.IsTrustedClusterKey(key) {
		var tc services.TrustedCluster
		if err := json.Unmarshal(value, &tc); err != nil {
			return nil, trace.BadParameter("trusted_cluster at %q: %v", key, err)
		}
		tc.Spec.Token = ""
		out, err := json.Marshal(tc)
		return out, trace.Wrap(err)
	}
	if !services.IsAuthorityKey(key) {
		return value, nil
	}
	var ca services.CertAuthority
	if err := json.Unmarshal(value, &ca); err != nil {
		return nil, trace.BadParameter("certificate authority at %q: %v", key, err)
	}
	ca.StripSecrets()
	out, err := json.Marshal(ca)
	return out, trace.Wrap(err)
}

// AccessEvents is the auth server's roles, CAs and their watch, for the
// AccessCache of a proxy or node whose auth server is elsewhere.
func (c *Client) AccessEvents() services.AccessEvents { return accessEvents{c} }

type accessEvents struct{ c *Client }

func (e accessEvents) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	return e.c.newWatcher(ctx, "/v1/watch/access", watch)
}

func (e accessEvents) GetRoles(ctx context.Context) ([]*services.Role, error) {
	return e.c.GetRoles(ctx)
}

func (e accessEvents) GetTrustedClusters(ctx context.Context) ([]services.TrustedCluster, error) {
	return e.c.GetTrustedClusters(ctx)
}

func (e accessEvents) GetCertAuthorities(ctx context.Context, t services.CertAuthType, withSecrets bool) ([]services.CertAuthority, error) {
	return e.c.GetCertAuthorities(ctx, t, withSecrets)
}

// watchNetworking streams the cluster networking config's events, for the
// NetworkingWatcher of a proxy whose auth server is elsewhere (the Router
// reads the config on every route).
func (a *APIServer) watchNetworking(w http.ResponseWriter, r *http.Request, p *peer) {
	a.watchRoots(w, r, p, nil, services.NetworkingKey())
}

// NetworkingEvents is the networking config and its watch, for a remote
// proxy's NetworkingWatcher.
func (c *Client) NetworkingEvents() services.NetworkingEvents { return networkingEvents{c} }

type networkingEvents struct{ c *Client }

func (e networkingEvents) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	return e.c.newWatcher(ctx, "/v1/watch/networking", watch)
}

func (e networkingEvents) GetClusterNetworkingConfig(ctx context.Context) (*services.ClusterNetworkingConfig, error) {
	return e.c.GetClusterNetworkingConfig(ctx)
}
