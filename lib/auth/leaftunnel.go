package auth

import (
	"context"
	"net/http"
	"net/url"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// RoleLeaf is the host role of a leaf cluster's proxy in the tunnel it
// keeps to a root (the `postern-host-role@postern.dev` extension): the
// root's tunnel port tells a leaf's tunnel from a node's by it. Only a
// leaf's auth server signs it, for its own proxies, with the leaf's host
// CA; the root checks it against the CA it stored at the exchange.
const RoleLeaf = "leaf"

// GenerateLeafTunnelCert certifies a proxy's key for its tunnels to root
// clusters: a host certificate of role leaf whose KeyId is the proxy's
// UUID and whose cluster extension names this cluster, so that the root
// knows which leaf's CA to check it against. proxyID comes from the
// caller's certificate, never from the request.
func (s *Server) GenerateLeafTunnelCert(ctx context.Context, proxyID string, publicKey []byte) ([]byte, error) {
	pub, err := parseAuthorizedKey(publicKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := checkName("host UUID", proxyID); err != nil {
		return nil, trace.Wrap(err)
	}
	now := s.clock.Now()
	cert := &ssh.Certificate{
		Key:             pub,
		CertType:        ssh.HostCert,
		KeyId:           proxyID,
		ValidPrincipals: []string{proxyID, proxyID + "." + s.cfg.ClusterName},
		ValidAfter:      uint64(now.Add(-clockSkew).Unix()),
		// As long as the CA, like every host certificate: trust is
		// withdrawn by removing the CA on the root (pctl clusters rm) or
		// the trusted_cluster here, not by expiry.
		ValidBefore: uint64(s.tlsCACert.NotAfter.Unix()),
		Permissions: ssh.Permissions{Extensions: map[string]string{
			services.CertExtensionHostRole: RoleLeaf,
			services.CertExtensionCluster:  s.cfg.ClusterName,
		}},
	}
	if err := s.sign(cert, s.hostSigner); err != nil {
		return nil, trace.Wrap(err)
	}
	return ssh.MarshalAuthorizedKey(cert), nil
}

// TouchRemoteCluster records that a proxy of this (root) cluster holds a
// live tunnel from leaf name now (auth's clock).
func (s *Server) TouchRemoteCluster(ctx context.Context, name string) error {
	return trace.Wrap(s.store.TouchRemoteCluster(ctx, name, s.clock.Now()))
}

// generateLeafTunnelCert serves POST /v1/certs/leaf for a proxy: the
// certificate names the calling proxy, whatever the body says.
func (a *APIServer) generateLeafTunnelCert(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.LeafTunnelCertRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	cert, err := a.auth.GenerateLeafTunnelCert(ctx, p.ID, req.PublicKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return authapi.CertResponse{Cert: cert}, nil
}

func (a *APIServer) touchRemoteCluster(ctx context.Context, _ *peer, r *http.Request) (any, error) {
	return nil, trace.Wrap(a.auth.TouchRemoteCluster(ctx, r.PathValue("name")))
}

// GenerateLeafTunnelCert asks auth to certify this proxy's key for its
// tunnels to root clusters (proxies only).
func (c *Client) GenerateLeafTunnelCert(ctx context.Context, publicKey []byte) ([]byte, error) {
	var resp authapi.CertResponse
	return resp.Cert, trace.Wrap(c.do(ctx, http.MethodPost, "/v1/certs/leaf", nil, authapi.LeafTunnelCertRequest{PublicKey: publicKey}, &resp))
}

// TouchRemoteCluster reports a live tunnel from leaf name (proxies only).
func (c *Client) TouchRemoteCluster(ctx context.Context, name string) error {
	return trace.Wrap(c.do(ctx, http.MethodPut, "/v1/remoteclusters/"+url.PathEscape(name)+"/heartbeat", nil, struct{}{}, nil))
}
