package auth

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
	"github.com/postern-dev/postern/lib/utils"
)

// TestOpenSSHRootUserCert: a leaf's proxy gets, for a root user's
// certificate, a certificate of the leaf's user CA for the same key that
// names exactly the logins the mapped roles allow on the OpenSSH node (not
// the root certificate's), carries no forwarding permit and lives for a
// handshake. Refused: a certificate of this cluster's own CA, roles that
// map to no login on that node (labels), a Postern node, a locked user;
// a node identity cannot ask (the route table), nor a proxy for another
// cluster's node.
func TestOpenSSHRootUserCert(t *testing.T) {
	ctx := context.Background()
	root := newClusterEnv(t, "root")
	leaf := newClusterEnv(t, "leaf")
	// As lib/service wires it.
	leaf.auth.cfg.IdentifyRootUser = func(ctx context.Context, store *services.Store, clusterName string, clock clockwork.Clock, cert *ssh.Certificate) (*authz.Identity, error) {
		return srv.IdentifyRootUser(ctx, store, clusterName, clock, cert)
	}
	tc := trustedCluster(root, root.trustToken(t, services.TokenTypeTrustedCluster))
	tc.Spec.RoleMap = services.RoleMap{{Remote: "access", Local: []string{"dev"}}}
	_, err := leaf.adminClient(t).UpsertTrustedCluster(ctx, tc)
	require.NoError(t, err)
	require.NoError(t, leaf.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: "dev"}, Spec: services.RoleSpec{
		Logins: []string{"ubuntu"}, NodeLabels: map[string]services.LabelValues{"env": {"dev"}},
	}}))
	admin := leaf.adminClient(t)
	dev, err := admin.AddOpenSSHNode(ctx, authapi.OpenSSHNodeRequest{Name: "db1", Addr: "127.0.0.9:22", Labels: map[string]string{"env": "dev"}, PublicKey: newHostPub(t)})
	require.NoError(t, err)
	prod, err := admin.AddOpenSSHNode(ctx, authapi.OpenSSHNodeRequest{Name: "db2", Addr: "127.0.0.10:22", Labels: map[string]string{"env": "prod"}, PublicKey: newHostPub(t)})
	require.NoError(t, err)
	require.NoError(t, leaf.store.UpsertNode(ctx, services.Node{UUID: "node-1", Cluster: "leaf", Hostname: "web", Addr: "127.0.0.1:3022", Labels: map[string]string{"env": "dev"}}))

	// alice at the root: access, with the root logins root and ubuntu.
	_, err = root.adminClient(t).CreateUser(ctx, "alice", []byte("pw"), []string{"root", "ubuntu"}, []string{"access"}, false)
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	rootCert, err := root.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "alice", PublicKey: pub})
	require.NoError(t, err)
	key, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	require.NoError(t, err)

	proxy := leaf.client(t, leaf.identity(t, "proxy-1", RoleProxy))
	out, err := proxy.OpenSSHRootUserCert(ctx, dev.Node.UUID, rootCert)
	require.NoError(t, err)
	parsed, _, _, _, err := ssh.ParseAuthorizedKey(out)
	require.NoError(t, err)
	cert := parsed.(*ssh.Certificate)
	require.Equal(t, key.Marshal(), cert.Key.Marshal(), "the root user's own key")
	require.Equal(t, []string{"ubuntu"}, cert.ValidPrincipals, "the mapped role's logins, not the root's")
	require.Equal(t, "alice", cert.KeyId)
	require.True(t, (&ssh.CertChecker{IsUserAuthority: func(k ssh.PublicKey) bool {
		for _, l := range leaf.auth.UserCAKeys() {
			ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l))
			if err == nil && string(ca.Marshal()) == string(k.Marshal()) {
				return true
			}
		}
		return false
	}}).IsUserAuthority(cert.SignatureKey), "signed by the leaf's user CA")
	require.NotContains(t, cert.Permissions.Extensions, "permit-port-forwarding")
	require.NotContains(t, cert.Permissions.Extensions, "permit-agent-forwarding")
	require.Contains(t, cert.Permissions.Extensions, "permit-pty")
	require.LessOrEqual(t, time.Unix(int64(cert.ValidBefore), 0).Sub(leaf.clock.Now()), openSSHRootCertTTL)

	// The mapped roles reach no login on a prod node: refused, audited.
	_, err = proxy.OpenSSHRootUserCert(ctx, prod.Node.UUID, rootCert)
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	var denied []events.Event
	leaf.audit.mu.Lock()
	for _, e := range leaf.audit.all {
		if e.Type == events.AccessDenied && e.Fields[events.FieldKind] == "openssh_root_user_cert" {
			denied = append(denied, e)
		}
	}
	leaf.audit.mu.Unlock()
	require.Len(t, denied, 1)
	require.Equal(t, "alice", denied[0].User)
	require.Equal(t, prod.Node.UUID, denied[0].Fields[events.FieldServerID])
	// A Postern node, a node of nobody, and this cluster's own user.
	_, err = proxy.OpenSSHRootUserCert(ctx, "node-1", rootCert)
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = proxy.OpenSSHRootUserCert(ctx, "no-such-node", rootCert)
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = leaf.adminClient(t).CreateUser(ctx, "bob", []byte("pw"), []string{"ubuntu"}, []string{"access"}, false)
	require.NoError(t, err)
	own, err := leaf.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: "bob", PublicKey: pub})
	require.NoError(t, err)
	_, err = proxy.OpenSSHRootUserCert(ctx, dev.Node.UUID, own)
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.ErrorContains(t, err, "issued by this cluster")
	_, err = proxy.OpenSSHRootUserCert(ctx, dev.Node.UUID, []byte("not a cert"))
	require.True(t, trace.IsBadParameter(err), "%v", err)

	// A node identity may not ask.
	node := leaf.client(t, leaf.identity(t, "node-1", RoleNode))
	_, err = node.OpenSSHRootUserCert(ctx, dev.Node.UUID, rootCert)
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	// A lock on the user at the leaf.
	require.NoError(t, leaf.store.UpsertLock(ctx, services.Lock{Target: services.LockTarget{User: "alice"}, Message: "out"}))
	_, err = proxy.OpenSSHRootUserCert(ctx, dev.Node.UUID, rootCert)
	require.Error(t, err)
}
