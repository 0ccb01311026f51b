package auth

// A root cluster's user on a leaf's OpenSSH node. A Postern node of the
// leaf takes the root's certificate itself: it trusts the root's user CA
// (trusted_cluster) and maps the root roles to its own (role_map) before
// it checks the login. A stock sshd can do neither: it trusts this
// cluster's user CA only (postern_user_ca.pub), and the principals of a
// root certificate are the root roles' logins, not the mapped roles'.
// Trusting the root's CA there would let a root user log in as any login
// of their root roles, whatever the role_map says. So the leaf signs a
// certificate of its own for the root user's key, naming exactly the
// logins the mapped roles allow on that node, valid long enough for one
// handshake; the root proxy's web terminal, which holds the key, logs in
// with it (and records the session: nothing else sees it in clear).

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// openSSHRootCertTTL is how long a root user's certificate for an
// OpenSSH node is valid: sshd checks it at the handshake only, which the
// root proxy starts right after it got it.
const openSSHRootCertTTL = 2 * time.Minute

// SignOpenSSHRootUser signs, for proxy caller, a certificate for the
// root user whose certificate is rootCert to log in to this cluster's
// OpenSSH node nodeUUID: rootCert must be a valid certificate of a
// trusted root's user CA whose roles map to some here, and the mapped
// roles must allow at least one login on the node (labels as for any
// dial). Refusals are AccessDenied, audited as access.denied.
func (s *Server) SignOpenSSHRootUser(ctx context.Context, caller, nodeUUID string, rootCert []byte) ([]byte, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(rootCert)
	if err != nil {
		return nil, trace.BadParameter("cert: not an SSH certificate: %v", err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, trace.BadParameter("cert: a plain key, not a certificate")
	}
	node, err := s.openSSHNodeByUUID(ctx, nodeUUID)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	deny := func(err error) error {
		s.cfg.Audit.Emit(context.WithoutCancel(ctx), events.Event{Type: events.AccessDenied, User: cert.KeyId, Fields: events.Fields{
			events.FieldServerID: node.UUID, events.FieldServerHostname: node.Hostname, events.FieldKind: "openssh_root_user_cert",
			events.FieldReason: err.Error(), "proxy": caller,
		}})
		return err
	}
	if s.cfg.IdentifyRootUser == nil {
		return nil, trace.NotImplemented("this auth server does not check root clusters' users")
	}
	id, err := s.cfg.IdentifyRootUser(ctx, s.store, s.cfg.ClusterName, s.clock, cert)
	if err != nil {
		return nil, deny(trace.Wrap(err))
	}
	if err := s.checkUserLock(ctx, id.User); err != nil {
		return nil, deny(trace.Wrap(err))
	}
	logins := id.LoginsOn(&node)
	if len(logins) == 0 {
		return nil, deny(trace.AccessDenied("the roles of user %q allow no login on node %q", id.User, node.Hostname))
	}
	roles, err := json.Marshal(id.Checker.RoleNames())
	if err != nil {
		return nil, trace.Wrap(err)
	}
	now := s.clock.Now()
	expires := now.Add(openSSHRootCertTTL)
	if rootEnd := time.Unix(int64(cert.ValidBefore), 0); cert.ValidBefore != ssh.CertTimeInfinity && rootEnd.Before(expires) {
		expires = rootEnd
	}
	out := &ssh.Certificate{
		Key:             cert.Key,
		CertType:        ssh.UserCert,
		KeyId:           id.User,
		ValidPrincipals: logins,
		ValidAfter:      uint64(now.Add(-clockSkew).Unix()),
		ValidBefore:     uint64(expires.Unix()),
		// A web terminal: a pty, and no forwarding of any kind.
		Permissions: ssh.Permissions{Extensions: map[string]string{
			"permit-pty":                  "",
			services.CertExtensionUser:    id.User,
			services.CertExtensionRoles:   string(roles),
			services.CertExtensionCluster: cert.Permissions.Extensions[services.CertExtensionCluster],
		}},
	}
	if err := s.sign(out, s.userSigner); err != nil {
		return nil, trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"user": id.User, "node": node.UUID, "principals": logins, "proxy": caller}).Info("Issued a root user's certificate for an OpenSSH node.")
	return ssh.MarshalAuthorizedKey(out), nil
}

// openSSHNodeByUUID is this cluster's kind openssh node uuid.
func (s *Server) openSSHNodeByUUID(ctx context.Context, uuid string) (services.Node, error) {
	nodes, err := s.store.GetNodes(ctx, s.cfg.ClusterName)
	if err != nil {
		return services.Node{}, trace.Wrap(err)
	}
	for _, n := range nodes {
		if n.UUID == uuid && n.IsOpenSSH() {
			return n, nil
		}
	}
	return services.Node{}, trace.NotFound("no OpenSSH node %q in cluster %q", uuid, s.cfg.ClusterName)
}

// openSSHRootUserCert answers POST /v1/nodes/openssh/{uuid}/root-user-cert.
func (a *APIServer) openSSHRootUserCert(ctx context.Context, p *peer, r *http.Request) (any, error) {
	var req authapi.OpenSSHRootUserCertRequest
	if err := readJSON(r, &req); err != nil {
		return nil, trace.Wrap(err)
	}
	cert, err := a.auth.SignOpenSSHRootUser(ctx, p.ID, r.PathValue("uuid"), req.Cert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return authapi.OpenSSHRootUserCertResponse{Cert: cert}, nil
}

// OpenSSHRootUserCert asks for a root user's certificate for this
// cluster's OpenSSH node uuid (proxies only).
func (c *Client) OpenSSHRootUserCert(ctx context.Context, uuid string, rootCert []byte) ([]byte, error) {
	resp, err := call[authapi.OpenSSHRootUserCertResponse](ctx, c, http.MethodPost, "/v1/nodes/openssh/"+url.PathEscape(uuid)+"/root-user-cert", nil, authapi.OpenSSHRootUserCertRequest{Cert: rootCert})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return resp.Cert, nil
}
