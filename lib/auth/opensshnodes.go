package auth

// Registering a stock OpenSSH server (pctl nodes add-openssh): nothing of
// Postern runs on it, so it never joins and never heartbeats. An admin
// vouches for it instead: auth certifies the host key the admin gives
// (with the cluster's host CA, so that psh, `ssh -J` and the proxies'
// health checks verify it like any node) and writes a kind openssh record
// that never expires.

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// AddOpenSSHNode registers the OpenSSH server req describes: it checks
// the name and labels by the rules a joining node's are checked by, and
// refuses a name some node of the cluster already has (it would make
// `ssh NAME` ambiguous, and the admin most likely meant rotate-openssh),
// then signs the host certificate and writes the record. by is the
// admin's identity, for the audit log.
func (s *Server) AddOpenSSHNode(ctx context.Context, by string, req authapi.OpenSSHNodeRequest) (*authapi.OpenSSHNodeResponse, error) {
	pub, err := parseOpenSSHHostKey(req.PublicKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if req.Name == "" {
		return nil, trace.BadParameter("missing node name")
	}
	node := services.Node{
		UUID:     uuid.NewString(),
		Cluster:  s.cfg.ClusterName,
		Hostname: req.Name,
		Addr:     req.Addr,
		Labels:   req.Labels,
		Kind:     services.NodeKindOpenSSH,
	}
	if err := node.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	clusters, err := s.knownClusters(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.checkHostHostname(RoleNode, node.Hostname, node.UUID, node.Addr, clusters); err != nil {
		return nil, trace.BadParameter("node name %q: %v", node.Hostname, trace.UserMessage(err))
	}
	nodes, err := s.store.GetNodes(ctx, s.cfg.ClusterName)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for _, n := range nodes {
		if strings.EqualFold(n.Hostname, node.Hostname) || strings.EqualFold(n.UUID, node.Hostname) {
			return nil, trace.AlreadyExists("a node named %q exists already (uuid %s): reissue an OpenSSH server's certificate with pctl nodes rotate-openssh, or remove the node first (pctl nodes rm)", node.Hostname, n.UUID)
		}
	}
	cert, err := s.signOpenSSHHostCert(pub, node)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.store.UpsertNode(ctx, node); err != nil {
		return nil, trace.Wrap(err)
	}
	s.emitOpenSSHNode(ctx, events.NodeCreate, by, node, pub)
	s.log.WithFields(map[string]any{"node": node.UUID, "hostname": node.Hostname, "addr": node.Addr}).Info("Registered an OpenSSH node.")
	return &authapi.OpenSSHNodeResponse{Node: node, HostCert: cert, UserCAKeys: s.UserCAKeys()}, nil
}

// RotateOpenSSHNode reissues the host certificate of the OpenSSH node
// named name (its hostname, or its UUID) for the key given, which may be
// the same key (a certificate about to end, a lost file) or a new one
// (the server's host key was replaced). The record is left as it is.
func (s *Server) RotateOpenSSHNode(ctx context.Context, by, name string, publicKey []byte) (*authapi.OpenSSHNodeResponse, error) {
	pub, err := parseOpenSSHHostKey(publicKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	node, err := s.findOpenSSHNode(ctx, name)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cert, err := s.signOpenSSHHostCert(pub, node)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	s.emitOpenSSHNode(ctx, events.NodeRotate, by, node, pub)
	s.log.WithFields(map[string]any{"node": node.UUID, "hostname": node.Hostname}).Info("Reissued an OpenSSH node's host certificate.")
	return &authapi.OpenSSHNodeResponse{Node: node, HostCert: cert, UserCAKeys: s.UserCAKeys()}, nil
}

// parseOpenSSHHostKey parses a server's public host key and refuses the
// kinds whose certificates Postern's clients (psh, the proxies' health
// checks) do not accept: sshd would present a certificate nobody of
// Postern's negotiates, and the node would only ever be offline.
func parseOpenSSHHostKey(data []byte) (ssh.PublicKey, error) {
	pub, err := parseAuthorizedKey(data)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	switch pub.Type() {
	case ssh.KeyAlgoED25519, ssh.KeyAlgoRSA:
		return pub, nil
	}
	return nil, trace.BadParameter("host key of type %s: Postern's clients accept host certificates for ssh-ed25519 and ssh-rsa keys only; give the server's ed25519 key (/etc/ssh/ssh_host_ed25519_key.pub)", pub.Type())
}

// findOpenSSHNode returns the one OpenSSH node of this cluster with
// hostname or UUID name. A Postern node of that name is not one: its
// certificate comes from its join, and reissuing one here would hand its
// name to whoever holds the key.
func (s *Server) findOpenSSHNode(ctx context.Context, name string) (services.Node, error) {
	nodes, err := s.store.GetNodes(ctx, s.cfg.ClusterName)
	if err != nil {
		return services.Node{}, trace.Wrap(err)
	}
	var found []services.Node
	postern := false
	for _, n := range nodes {
		if n.UUID != name && !strings.EqualFold(n.Hostname, name) {
			continue
		}
		if !n.IsOpenSSH() {
			postern = true
			continue
		}
		found = append(found, n)
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		ids := make([]string, len(found))
		for i, n := range found {
			ids[i] = n.UUID
		}
		return services.Node{}, trace.BadParameter("%d OpenSSH nodes are named %q (%s): name one by its uuid", len(found), name, strings.Join(ids, ", "))
	case postern:
		return services.Node{}, trace.BadParameter("node %q is a Postern node, not an OpenSSH server: its host certificate comes from its join", name)
	}
	return services.Node{}, trace.NotFound("no OpenSSH node named %q in cluster %q", name, s.cfg.ClusterName)
}

// signOpenSSHHostCert certifies pub as node: principals NAME, NAME.CLUSTER
// and the host of its address (what `ssh -J proxy HOST` checks). Not its
// UUID: nobody types it, and `ssh UUID` through the proxy is checked
// against the name the proxy resolved anyway. No host role extension:
// the reverse tunnel port admits only certificates that carry "node", and
// a stock sshd's key opens no tunnel.
func (s *Server) signOpenSSHHostCert(pub ssh.PublicKey, node services.Node) ([]byte, error) {
	host, _, err := services.SplitAddr(node.Addr)
	if err != nil {
		return nil, trace.BadParameter("node %q: addr: %v", node.Hostname, err)
	}
	var principals []string
	for _, p := range []string{node.Hostname, node.Hostname + "." + s.cfg.ClusterName,
		// OpenSSH lower-cases the name it checks (see hostPrincipals).
		strings.ToLower(node.Hostname), strings.ToLower(node.Hostname + "." + s.cfg.ClusterName), host} {
		if !slices.Contains(principals, p) {
			principals = append(principals, p)
		}
	}
	now := s.clock.Now()
	cert := &ssh.Certificate{
		Key:             pub,
		CertType:        ssh.HostCert,
		KeyId:           node.UUID,
		ValidPrincipals: principals,
		ValidAfter:      uint64(now.Add(-clockSkew).Unix()),
		// As long as the CA, as for Postern nodes: host certificates are
		// not renewed, and rotate-openssh reissues one when needed.
		ValidBefore: uint64(s.tlsCACert.NotAfter.Unix()),
	}
	if err := s.sign(cert, s.hostSigner); err != nil {
		return nil, trace.Wrap(err)
	}
	return ssh.MarshalAuthorizedKey(cert), nil
}

func (s *Server) emitOpenSSHNode(ctx context.Context, typ, by string, node services.Node, pub ssh.PublicKey) {
	s.cfg.Audit.Emit(context.WithoutCancel(ctx), events.Event{Type: typ, User: by, Fields: events.Fields{
		events.FieldServerID:       node.UUID,
		events.FieldServerHostname: node.Hostname,
		events.FieldServerAddr:     node.Addr,
		events.FieldKind:           node.Kind,
		events.FieldFingerprint:    ssh.FingerprintSHA256(pub),
	}})
}

// addOpenSSHNode answers POST /v1/nodes/openssh.
func (a *APIServer) addOpenSSHNode(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.OpenSSHNodeRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.AddOpenSSHNode(ctx, p.ID, req)
	return resp, trace.Wrap(err)
}

// rotateOpenSSHNode answers POST /v1/nodes/openssh/{name}/rotate.
func (a *APIServer) rotateOpenSSHNode(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.OpenSSHNodeRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := a.auth.RotateOpenSSHNode(ctx, p.ID, r.PathValue("name"), req.PublicKey)
	return resp, trace.Wrap(err)
}

// AddOpenSSHNode registers an OpenSSH server (admin only).
func (c *Client) AddOpenSSHNode(ctx context.Context, req authapi.OpenSSHNodeRequest) (*authapi.OpenSSHNodeResponse, error) {
	return call[authapi.OpenSSHNodeResponse](ctx, c, http.MethodPost, "/v1/nodes/openssh", nil, req)
}

// RotateOpenSSHNode reissues an OpenSSH server's host certificate for
// publicKey (admin only).
func (c *Client) RotateOpenSSHNode(ctx context.Context, name string, publicKey []byte) (*authapi.OpenSSHNodeResponse, error) {
	return call[authapi.OpenSSHNodeResponse](ctx, c, http.MethodPost, "/v1/nodes/openssh/"+url.PathEscape(name)+"/rotate", nil, authapi.OpenSSHNodeRequest{PublicKey: publicKey})
}
