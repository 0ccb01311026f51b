package auth

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// rootJoin joins the root cluster with a fresh node token, as a second
// host holding a real token does.
func rootJoin(t *testing.T, root *clusterEnv, hostname string, principals ...string) (*Identity, error) {
	t.Helper()
	tok, err := root.auth.CreateToken(context.Background(), services.TokenTypeNode, 0)
	require.NoError(t, err)
	p := joinParams(root.testEnv, tok.Name, RoleNode, hostname)
	p.AdditionalPrincipals = principals
	return Join(context.Background(), p)
}

// TestLeafNamesAreReservedOnTheRoot is the attack of a root node taking
// NAME.LEAF: while l1 is a leaf of the root, a node joining the root with
// a real token as ldb.l1, or asking for ldb.l1 as an extra principal, or
// heartbeating as ldb.l1 later, is refused; rule 0 sends ldb.l1 into the
// leaf, and a root certificate for it would answer for it once the trust
// is gone. Refusals name the leaf.
func TestLeafNamesAreReservedOnTheRoot(t *testing.T) {
	ctx := context.Background()
	root := newClusterEnv(t, "root")
	leaf := newClusterEnv(t, "l1")
	_, err := leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, root.trustToken(t, services.TokenTypeTrustedCluster)))
	require.NoError(t, err)

	_, err = rootJoin(t, root, "ldb.l1")
	requireKind(t, err, trace.IsBadParameter, `hostname "ldb.l1" ends in .l1`)
	_, err = rootJoin(t, root, "LDB.L1")
	requireKind(t, err, trace.IsBadParameter, `ends in .l1`)
	_, err = rootJoin(t, root, "ldb", "ldb.l1")
	requireKind(t, err, trace.IsBadParameter, `additional principal "ldb.l1" refused`)
	_, err = rootJoin(t, root, "l1")
	requireKind(t, err, trace.IsBadParameter, `is the name of cluster "l1"`)

	// A node that joined honestly cannot rename itself into the leaf on a
	// heartbeat, though its address answers with its own certificate.
	id, err := rootJoin(t, root, "ldb")
	require.NoError(t, err)
	srv := serveHostKey(t, id.SSHSigner)
	clt := root.client(t, id)
	beat := func(hostname string) error {
		return clt.UpsertNode(ctx, services.Node{UUID: id.ID, Hostname: hostname, Addr: srv.addr})
	}
	require.NoError(t, beat("ldb"))
	requireKind(t, beat("ldb.l1"), trace.IsBadParameter, `hostname "ldb.l1" ends in .l1`)
	got, err := root.store.GetNode(ctx, "root", id.ID)
	require.NoError(t, err)
	require.Equal(t, "ldb", got.Hostname)

	// On the leaf, the root's name is reserved the same way.
	_, err = rootJoin(t, leaf, "x.root")
	requireKind(t, err, trace.IsBadParameter, `hostname "x.root" ends in .root`)

	// Without a valid token nobody learns the leaves' names from a
	// refusal: the token is checked first.
	p := joinParams(root.testEnv, "0123456789abcdef0123456789abcdef", RoleNode, "ldb.l1")
	_, err = Join(ctx, p)
	requireKind(t, err, trace.IsAccessDenied, "not found or already used")
}

// TestTrustRefusedWhileARootNodeUsesTheName: establishing trust with a
// leaf whose name a root node already uses as a suffix (hostname x.l2, or
// an address host x.l2) reports the conflict naming the node, and spends
// no token; once the node is gone, the same token works. The leaf side
// refuses a root whose name one of its nodes uses the same way.
func TestTrustRefusedWhileARootNodeUsesTheName(t *testing.T) {
	ctx := context.Background()
	root := newClusterEnv(t, "root")
	leaf := newClusterEnv(t, "l2")

	// Before l2 is known, x.l2 is an ordinary name: the node joins.
	id, err := rootJoin(t, root, "x.l2")
	require.NoError(t, err)
	srv := serveHostKey(t, id.SSHSigner)
	require.NoError(t, root.client(t, id).UpsertNode(ctx, services.Node{UUID: id.ID, Hostname: "x.l2", Addr: srv.addr}))

	token := root.trustToken(t, services.TokenTypeTrustedCluster)
	_, err = leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, token))
	requireKind(t, err, trace.IsAlreadyExists, `node "`+id.ID+`" of cluster "root" is called "x.l2"`)
	_, err = root.store.GetRemoteCluster(ctx, "l2")
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = leaf.store.GetTrustedCluster(ctx, "root")
	require.True(t, trace.IsNotFound(err), "%v", err)

	// An address host counts too: it is a principal of the certificate.
	require.NoError(t, root.store.DeleteNode(ctx, "root", id.ID))
	require.NoError(t, root.store.UpsertNode(ctx, services.Node{
		UUID: id.ID, Hostname: "x", Addr: "db.l2:3022", Cluster: "root",
		Expires: root.clock.Now().Add(time.Minute),
	}))
	_, err = leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, token))
	requireKind(t, err, trace.IsAlreadyExists, `is called "db.l2"`)

	// The leaf refuses a root whose name its own node uses.
	lid, err := rootJoin(t, leaf, "y.root")
	require.NoError(t, err)
	require.NoError(t, leaf.store.UpsertNode(ctx, services.Node{
		UUID: lid.ID, Hostname: "y.root", Addr: "127.0.0.1:3022", Cluster: "l2",
		Expires: leaf.clock.Now().Add(time.Minute),
	}))
	require.NoError(t, root.store.DeleteNode(ctx, "root", id.ID))
	_, err = leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, token))
	requireKind(t, err, trace.IsAlreadyExists, `node "`+lid.ID+`" of cluster "l2" is called "y.root"`)

	// Both renamed: the token, never spent, establishes the trust.
	require.NoError(t, leaf.store.DeleteNode(ctx, "l2", lid.ID))
	_, err = leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, token))
	require.NoError(t, err)
}
