package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

func ecdsaPub(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	pub, err := ssh.NewPublicKey(&k.PublicKey)
	require.NoError(t, err)
	return ssh.MarshalAuthorizedKey(pub)
}

func newHostPub(t *testing.T) []byte {
	t.Helper()
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	return pub
}

// TestAddOpenSSHNode: an admin registers an OpenSSH server and gets a host
// certificate of the cluster's host CA for the key given, naming NAME,
// NAME.CLUSTER and the address's host (not the UUID), with the user CA
// keys; the record is kind openssh without expiry; the act is audited.
// Bad names, labels, addresses and keys, and a name some node holds,
// are refused with what was wrong, and nothing is written.
func TestAddOpenSSHNode(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	admin := env.adminClient(t)
	pub := newHostPub(t)

	resp, err := admin.AddOpenSSHNode(ctx, authapi.OpenSSHNodeRequest{Name: "db1", Addr: "127.0.0.9:2222", Labels: map[string]string{"env": "prod"}, PublicKey: pub})
	require.NoError(t, err)
	require.Equal(t, services.NodeKindOpenSSH, resp.Node.Kind)
	require.Equal(t, "db1", resp.Node.Hostname)
	require.NotEmpty(t, resp.Node.UUID)
	require.Equal(t, env.auth.UserCAKeys(), resp.UserCAKeys)

	stored, err := env.store.GetNode(ctx, testCluster, resp.Node.UUID)
	require.NoError(t, err)
	require.Equal(t, services.NodeKindOpenSSH, stored.Kind)
	require.True(t, stored.Expires.IsZero())
	require.Equal(t, map[string]string{"env": "prod"}, stored.Labels)
	require.Equal(t, "127.0.0.9:2222", stored.Addr)

	cert := parseSSHCert(t, resp.HostCert)
	require.Equal(t, uint32(ssh.HostCert), cert.CertType)
	require.ElementsMatch(t, []string{"db1", "db1." + testCluster, "127.0.0.9"}, cert.ValidPrincipals)
	require.NotContains(t, cert.Extensions, services.CertExtensionHostRole, "opens no reverse tunnel")
	wantKey, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	require.NoError(t, err)
	require.Equal(t, wantKey.Marshal(), cert.Key.Marshal())
	var hostCAs []ssh.PublicKey
	for _, l := range env.auth.HostCAKeys() {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l))
		require.NoError(t, err)
		hostCAs = append(hostCAs, k)
	}
	for _, name := range []string{"db1", "db1." + testCluster, "127.0.0.9"} {
		require.NoError(t, authz.CheckHostCert(hostCAs, name, cert, env.clock), name)
	}
	require.Error(t, authz.CheckHostCert(hostCAs, resp.Node.UUID, cert, env.clock))

	e := waitEvent(t, rec, events.NodeCreate, func(e events.Event) bool { return e.Fields[events.FieldServerID] == resp.Node.UUID })
	require.Equal(t, "db1", e.Fields[events.FieldServerHostname])
	require.Equal(t, ssh.FingerprintSHA256(wantKey), e.Fields[events.FieldFingerprint])
	require.NotEmpty(t, e.User)

	for _, tc := range []struct {
		name string
		req  authapi.OpenSSHNodeRequest
		is   func(error) bool
		want string
	}{
		{"taken name", authapi.OpenSSHNodeRequest{Name: "DB1", Addr: "127.0.0.9:22", PublicKey: pub}, trace.IsAlreadyExists, `a node named "DB1" exists already`},
		{"NAME.CLUSTER", authapi.OpenSSHNodeRequest{Name: "x." + testCluster, Addr: "127.0.0.9:22", PublicKey: pub}, trace.IsBadParameter, `node name "x.` + testCluster + `"`},
		{"slash", authapi.OpenSSHNodeRequest{Name: "a/b", Addr: "127.0.0.9:22", PublicKey: pub}, trace.IsBadParameter, "hostname"},
		{"no name", authapi.OpenSSHNodeRequest{Addr: "127.0.0.9:22", PublicKey: pub}, trace.IsBadParameter, "missing node name"},
		{"no port", authapi.OpenSSHNodeRequest{Name: "db2", Addr: "127.0.0.9", PublicKey: pub}, trace.IsBadParameter, "addr"},
		{"bad label", authapi.OpenSSHNodeRequest{Name: "db2", Addr: "127.0.0.9:22", PublicKey: pub, Labels: map[string]string{"env": "\x1b[31m"}}, trace.IsBadParameter, `label "env"`},
		{"no key", authapi.OpenSSHNodeRequest{Name: "db2", Addr: "127.0.0.9:22"}, trace.IsBadParameter, "missing public key"},
		{"ecdsa", authapi.OpenSSHNodeRequest{Name: "db2", Addr: "127.0.0.9:22", PublicKey: ecdsaPub(t)}, trace.IsBadParameter, "host key of type ecdsa-sha2-nistp256"},
		{"a certificate", authapi.OpenSSHNodeRequest{Name: "db2", Addr: "127.0.0.9:22", PublicKey: resp.HostCert}, trace.IsBadParameter, "got a certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := admin.AddOpenSSHNode(ctx, tc.req)
			requireKind(t, err, tc.is, tc.want)
		})
	}
	nodes, err := env.store.GetNodes(ctx, testCluster)
	require.NoError(t, err)
	require.Len(t, nodes, 1, "nothing written by the refusals")
}

// TestRotateOpenSSHNode: the certificate is reissued for a new key (or
// the same one) under the same names; a Postern node's is not (its
// certificate comes from its join), nor an unknown name's.
func TestRotateOpenSSHNode(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	admin := env.adminClient(t)
	added, err := admin.AddOpenSSHNode(ctx, authapi.OpenSSHNodeRequest{Name: "db1", Addr: "127.0.0.9:2222", PublicKey: newHostPub(t)})
	require.NoError(t, err)

	pub := newHostPub(t)
	for _, name := range []string{"db1", added.Node.UUID} {
		resp, err := admin.RotateOpenSSHNode(ctx, name, pub)
		require.NoError(t, err)
		require.Equal(t, added.Node, resp.Node)
		cert := parseSSHCert(t, resp.HostCert)
		wantKey, _, _, _, err := ssh.ParseAuthorizedKey(pub)
		require.NoError(t, err)
		require.Equal(t, wantKey.Marshal(), cert.Key.Marshal())
		require.ElementsMatch(t, []string{"db1", "db1." + testCluster, "127.0.0.9"}, cert.ValidPrincipals)
	}
	waitEvent(t, rec, events.NodeRotate, func(e events.Event) bool { return e.Fields[events.FieldServerID] == added.Node.UUID })

	require.NoError(t, env.store.UpsertNode(ctx, services.Node{UUID: "n1", Cluster: testCluster, Hostname: "web", Addr: "127.0.0.1:3022"}))
	_, err = admin.RotateOpenSSHNode(ctx, "web", pub)
	requireKind(t, err, trace.IsBadParameter, `node "web" is a Postern node`)
	_, err = admin.RotateOpenSSHNode(ctx, "nope", pub)
	requireKind(t, err, trace.IsNotFound, `no OpenSSH node named "nope"`)
}
