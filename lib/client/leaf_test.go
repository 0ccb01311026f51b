package client

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/utils"
)

func caLine(ca *testCA) string {
	return string(trimNL(ssh.MarshalAuthorizedKey(ca.signer.PublicKey())))
}

// leafLogin stores a login as Login does, from host_signers of the root
// cluster "root" and its leaf "leaf", and loads it back.
func leafLogin(t *testing.T, rootCA, leafCA *testCA, proxySSH string) (*Store, *Credentials) {
	t.Helper()
	known, leaves, err := knownHostsOf([]authapi.HostSigner{
		{ClusterName: "root", CheckingKeys: []string{caLine(rootCA)}},
		{ClusterName: "leaf", CheckingKeys: []string{caLine(leafCA)}},
	}, "root")
	require.NoError(t, err)
	require.Equal(t, []string{"leaf"}, leaves)
	priv, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	pk, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	require.NoError(t, err)
	st := NewStore(filepath.Join(t.TempDir(), "home"))
	require.NoError(t, st.Save(&StoredLogin{
		Profile: Profile{Proxy: "root.example:3080", ProxySSH: proxySSH, User: "alice", Cluster: "root", Clusters: leaves},
		Key:     priv, Pub: pub, Cert: ssh.MarshalAuthorizedKey(rootCA.sign(t, pk, ssh.UserCert, []string{"alice"}, time.Now().Add(time.Hour))),
		KnownHosts: known,
	}))
	creds, err := st.Credentials(time.Now())
	require.NoError(t, err)
	return st, creds
}

// TestKnownHostsScopeLeafCAs: the known_hosts psh writes trusts the root's
// host CA for every name and a leaf's only for *.LEAF; the profile keeps
// the leaves. Bad host_signers are refused before anything is written.
func TestKnownHostsScopeLeafCAs(t *testing.T) {
	rootCA, leafCA := newTestCA(t), newTestCA(t)
	st, creds := leafLogin(t, rootCA, leafCA, "127.0.0.1:3023")
	data, err := os.ReadFile(st.KnownHostsPath())
	require.NoError(t, err)
	require.Equal(t, "@cert-authority * "+caLine(rootCA)+"\n@cert-authority *.leaf "+caLine(leafCA)+"\n", string(data))
	require.Equal(t, []string{"leaf"}, creds.Profile.Clusters)
	require.Len(t, creds.HostAuthorities, 2)

	for name, c := range map[string]struct {
		signers []authapi.HostSigner
		want    string
	}{
		"no local CA":          {[]authapi.HostSigner{{ClusterName: "leaf", CheckingKeys: []string{caLine(leafCA)}}}, `no host CA for cluster "root"`},
		"a pattern for a name": {[]authapi.HostSigner{{ClusterName: "root", CheckingKeys: []string{caLine(rootCA)}}, {ClusterName: "* ", CheckingKeys: []string{caLine(leafCA)}}}, "invalid cluster name"},
		"a cluster twice":      {[]authapi.HostSigner{{ClusterName: "root", CheckingKeys: []string{caLine(rootCA)}}, {ClusterName: "root", CheckingKeys: []string{caLine(leafCA)}}}, "two host CA entries"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := knownHostsOf(c.signers, "root")
			require.ErrorContains(t, err, c.want)
		})
	}
}

// TestDialLeafNodeScoped: psh reaches a leaf's node as HOST.LEAF through
// `proxy:HOST:0@LEAF` and checks its certificate against the leaf's CA;
// a node presenting a certificate the leaf's CA signed for a root host's
// name (a leaf admin impersonating a root node) is refused, over a real
// SSH handshake.
func TestDialLeafNodeScoped(t *testing.T) {
	rootCA, leafCA := newTestCA(t), newTestCA(t)
	var mu sync.Mutex
	var subs []string
	onSub := func(s string) { mu.Lock(); subs = append(subs, s); mu.Unlock() }
	lastSub := func() string { mu.Lock(); defer mu.Unlock(); return subs[len(subs)-1] }
	ka := KeepAliveConfig{Clock: clockwork.NewFakeClock()}
	ctx := context.Background()

	// The leaf's node, certified by the leaf's CA as its own.
	addr := startJumpProxyWith(t, hostSigner(t, rootCA, "127.0.0.1"), hostSigner(t, leafCA, "db", "db.leaf"), onSub)
	_, creds := leafLogin(t, rootCA, leafCA, addr)
	for _, tc := range []struct {
		target proxy.Target
		sub    string
	}{
		{proxy.Target{Host: "db", Cluster: "leaf"}, "proxy:db:0@leaf"},
		{ClusterTarget(proxy.Target{Host: "db.leaf", Cluster: "leaf"}), "proxy:db:0@leaf"},
		{proxy.Target{Host: "db.leaf"}, "proxy:db.leaf"},
	} {
		nc, err := DialNode(ctx, creds, tc.target, "alice", ka)
		require.NoError(t, err, "%v", tc.target)
		require.NoError(t, nc.Close())
		require.Equal(t, tc.sub, lastSub())
	}
	nodes, err := ListNodes(ctx, creds, "leaf")
	require.NoError(t, err)
	require.Empty(t, nodes)
	require.Equal(t, "nodes@leaf", lastSub())
	_, err = ListNodes(ctx, creds, "root")
	require.NoError(t, err)
	require.Equal(t, "nodes", lastSub())

	// A "root node" whose certificate the leaf's CA signed, naming it.
	addr = startJumpProxyWith(t, hostSigner(t, rootCA, "127.0.0.1"), hostSigner(t, leafCA, "node1", "node1.root", "node1.leaf"), nil)
	_, creds = leafLogin(t, rootCA, leafCA, addr)
	for _, target := range []proxy.Target{{Host: "node1"}, {Host: "node1", Cluster: "root"}, {Host: "node1.root"}} {
		_, err = DialNode(ctx, creds, target, "alice", ka)
		require.ErrorContains(t, err, "trusted only for *.leaf", "%v", target)
	}
	// The same certificate is fine for the leaf's own name.
	nc, err := DialNode(ctx, creds, proxy.Target{Host: "node1", Cluster: "leaf"}, "alice", ka)
	require.NoError(t, err)
	require.NoError(t, nc.Close())

	// A cluster the login holds no CA for: the hint to log in again.
	_, err = DialNode(ctx, creds, proxy.Target{Host: "node1", Cluster: "other"}, "alice", ka)
	require.ErrorContains(t, err, `no host CA for that cluster`)
	require.True(t, strings.Contains(err.Error(), "psh login"), "%v", err)
}
