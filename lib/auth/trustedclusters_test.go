package auth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// recordingEmitter keeps every audit event; mu guards all.
type recordingEmitter struct {
	mu  sync.Mutex
	all []events.Event
}

func (r *recordingEmitter) Emit(_ context.Context, e events.Event) {
	r.mu.Lock()
	r.all = append(r.all, e)
	r.mu.Unlock()
}

// find returns the first event of typ naming cluster. Auth emits before
// it answers, so no waiting is needed.
func (r *recordingEmitter) find(typ, cluster string) (events.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.all {
		if e.Type == typ && e.Fields[events.FieldRemoteCluster] == cluster {
			return e, true
		}
	}
	return events.Event{}, false
}

// clusterEnv is an auth server with its API, named as a test wants, whose
// DialProxy reaches another cluster's auth API directly: the join relay
// it stands for is a raw byte pipe, so the pinned TLS and everything in
// it are exactly what a relayed exchange carries.
type clusterEnv struct {
	*testEnv
	audit *recordingEmitter
}

func newClusterEnv(t *testing.T, name string) *clusterEnv {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	store := newTestStore(t, clock)
	adminDir := filepath.Join(t.TempDir(), "admin")
	audit := &recordingEmitter{}
	srv, err := NewServer(ServerConfig{
		Store:            store,
		ClusterName:      name,
		AdminIdentityDir: adminDir,
		BcryptCost:       bcrypt.MinCost,
		Deps:             observe.Deps{Clock: clock, Logger: testLogger(), Audit: audit},
		Recordings:       recording.DirStorage{Dir: t.TempDir()},
		DialProxy: func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
	})
	require.NoError(t, err)
	env := &clusterEnv{testEnv: &testEnv{clock: clock, store: store, auth: srv, adminDir: adminDir}, audit: audit}
	startAPI(t, env.testEnv)
	return env
}

// trustToken makes a token of typ on the root and returns it as the root's
// pctl prints it (SECRET@PIN).
func (e *clusterEnv) trustToken(t *testing.T, typ string) string {
	t.Helper()
	tok, err := e.auth.CreateToken(context.Background(), typ, 0)
	require.NoError(t, err)
	return services.TrustedClusterToken(tok.Name, e.auth.CAPin())
}

func trustedCluster(root *clusterEnv, token string) *services.TrustedCluster {
	return &services.TrustedCluster{
		Metadata: services.Metadata{Name: root.auth.ClusterName()},
		Spec: services.TrustedClusterSpec{
			Enabled:   true,
			ProxyAddr: root.addr,
			Token:     token,
			RoleMap:   services.RoleMap{{Remote: "access", Local: []string{"access"}}},
		},
	}
}

func caKeys(t *testing.T, s *services.Store, cluster string, typ services.CertAuthType) []string {
	t.Helper()
	ca, err := s.GetCertAuthority(context.Background(), cluster, typ, false)
	require.NoError(t, err)
	return ca.SSHPublicKeys
}

// TestTrustedClusterExchange: a leaf spends a root's token through the
// admin API (pctl create -f), the two auth servers hold each other's
// public CA keys afterwards and the root records the leaf; removing trust
// on either side deletes the other's CAs, and trust is re-established
// with a new token.
func TestTrustedClusterExchange(t *testing.T) {
	ctx := context.Background()
	root := newClusterEnv(t, "root")
	leaf := newClusterEnv(t, "leaf")

	tc := trustedCluster(root, root.trustToken(t, services.TokenTypeTrustedCluster))
	_, err := leaf.adminClient(t).UpsertTrustedCluster(ctx, tc)
	require.NoError(t, err)

	require.Equal(t, leaf.auth.HostCAKeys(), caKeys(t, root.store, "leaf", services.HostCA))
	require.Equal(t, leaf.auth.UserCAKeys(), caKeys(t, root.store, "leaf", services.UserCA))
	require.Equal(t, root.auth.HostCAKeys(), caKeys(t, leaf.store, "root", services.HostCA))
	require.Equal(t, root.auth.UserCAKeys(), caKeys(t, leaf.store, "root", services.UserCA))
	// Neither side ever holds the other's private keys.
	for _, s := range []*services.Store{root.store, leaf.store} {
		for _, name := range []string{"root", "leaf"} {
			for _, typ := range []services.CertAuthType{services.HostCA, services.UserCA} {
				ca, err := s.GetCertAuthority(ctx, name, typ, true)
				require.NoError(t, err)
				if (s == root.store) != (name == "root") {
					require.Empty(t, ca.SSHPrivateKeys)
					require.Empty(t, ca.TLSKey)
				}
			}
		}
	}
	rcs, err := root.adminClient(t).GetRemoteClusters(ctx)
	require.NoError(t, err)
	require.Len(t, rcs, 1)
	require.Equal(t, "leaf", rcs[0].Name)
	require.Equal(t, root.clock.Now().UTC(), rcs[0].Created)
	tcs, err := leaf.adminClient(t).GetTrustedClusters(ctx)
	require.NoError(t, err)
	require.Len(t, tcs, 1)
	requireEvent(t, root.audit, events.LeafAdd, "leaf")
	requireEvent(t, leaf.audit, events.TrustAdd, "root")

	// Editing the role map of an established trust does not contact the
	// root again (its token is spent).
	tc.Spec.RoleMap = services.RoleMap{{Remote: "*", Local: []string{"access"}}}
	_, err = leaf.adminClient(t).UpsertTrustedCluster(ctx, tc)
	require.NoError(t, err)
	got, err := leaf.store.GetTrustedCluster(ctx, "root")
	require.NoError(t, err)
	require.Equal(t, "*", got.Spec.RoleMap[0].Remote)

	// The leaf withdraws trust: the root's CAs go with the record.
	require.NoError(t, leaf.adminClient(t).DeleteTrustedCluster(ctx, "root"))
	_, err = leaf.store.GetCertAuthority(ctx, "root", services.UserCA, false)
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = leaf.store.GetCertAuthority(ctx, "root", services.HostCA, false)
	require.True(t, trace.IsNotFound(err), "%v", err)
	requireKind(t, leaf.adminClient(t).DeleteTrustedCluster(ctx, "root"), trace.IsNotFound, `trusted_cluster "root" not found`)
	// The leaf's own CAs are untouched.
	require.Equal(t, leaf.auth.UserCAKeys(), caKeys(t, leaf.store, "leaf", services.UserCA))

	// While the root still has the leaf, a new exchange is refused.
	_, err = leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, root.trustToken(t, services.TokenTypeTrustedCluster)))
	requireKind(t, err, trace.IsAlreadyExists, `cluster "leaf" is already a leaf of this cluster`)

	// The root removes the leaf: its CAs go, and a new token works.
	require.NoError(t, root.adminClient(t).DeleteRemoteCluster(ctx, "leaf"))
	_, err = root.store.GetCertAuthority(ctx, "leaf", services.HostCA, false)
	require.True(t, trace.IsNotFound(err), "%v", err)
	require.Equal(t, root.auth.HostCAKeys(), caKeys(t, root.store, "root", services.HostCA))
	requireKind(t, root.adminClient(t).DeleteRemoteCluster(ctx, "leaf"), trace.IsNotFound, `remote cluster "leaf" not found`)
	// Removing "root" (this cluster itself) is not a thing a root can do.
	requireKind(t, root.adminClient(t).DeleteRemoteCluster(ctx, "root"), trace.IsNotFound, `remote cluster "root" not found`)
	_, err = leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, root.trustToken(t, services.TokenTypeTrustedCluster)))
	require.NoError(t, err)
}

func requireEvent(t *testing.T, r *recordingEmitter, typ, cluster string) events.Event {
	t.Helper()
	e, ok := r.find(typ, cluster)
	require.True(t, ok, "no %s event for %q", typ, cluster)
	return e
}

// TestTrustedClusterRefusals is the bad input of the exchange, each case
// as the attack or mistake it is, with the error the operator sees, and
// for those refused before the token is spent, proof that it was not.
func TestTrustedClusterRefusals(t *testing.T) {
	ctx := context.Background()
	root := newClusterEnv(t, "root")
	leaf := newClusterEnv(t, "leaf")
	create := func(env *clusterEnv, tc *services.TrustedCluster) error {
		_, err := env.adminClient(t).UpsertTrustedCluster(ctx, tc)
		return err
	}

	t.Run("token reused", func(t *testing.T) {
		tok := root.trustToken(t, services.TokenTypeTrustedCluster)
		first := newClusterEnv(t, "first")
		require.NoError(t, create(first, trustedCluster(root, tok)))
		err := create(newClusterEnv(t, "second"), trustedCluster(root, tok))
		requireKind(t, err, trace.IsAccessDenied, "join token not found or already used")
		requireEvent(t, root.audit, events.LeafAddFailed, "second")
	})
	t.Run("token expired", func(t *testing.T) {
		tok := root.trustToken(t, services.TokenTypeTrustedCluster)
		root.clock.Advance(DefaultTokenTTL + time.Second)
		requireKind(t, create(leaf, trustedCluster(root, tok)), trace.IsAccessDenied, "join token expired")
	})
	t.Run("token of another type", func(t *testing.T) {
		for _, typ := range []string{services.TokenTypeNode, services.TokenTypeProxy} {
			tok := root.trustToken(t, typ)
			requireKind(t, create(leaf, trustedCluster(root, tok)), trace.IsAccessDenied, "cannot be used to join as trusted_cluster")
		}
	})
	t.Run("a trusted_cluster token joins no host", func(t *testing.T) {
		tok, err := root.auth.CreateToken(ctx, services.TokenTypeTrustedCluster, 0)
		require.NoError(t, err)
		for _, role := range []string{RoleNode, RoleProxy} {
			_, err = Join(ctx, JoinParams{AuthAddr: root.addr, Token: tok.Name, CAPin: root.auth.CAPin(), Role: role, Hostname: "h", Clock: root.clock})
			requireKind(t, err, trace.IsAccessDenied, "cannot be used to join as "+role)
		}
	})
	t.Run("leaf named like the root", func(t *testing.T) {
		tok := root.trustToken(t, services.TokenTypeTrustedCluster)
		impostor := newClusterEnv(t, "root2")
		// Same name as the root: refused on the leaf already...
		tc := trustedCluster(root, tok)
		tc.Metadata.Name = "root2"
		requireKind(t, create(impostor, tc), trace.IsBadParameter, "this cluster's own name")
		// ...and by the root, whatever a modified leaf sends.
		_, err := root.auth.RegisterLeafCluster(ctx, trustRequest(t, root, "root", tok, impostor))
		requireKind(t, err, trace.IsBadParameter, `the leaf cluster is named "root", like this root cluster`)
		requireTokenUnspent(t, root, tok)
	})
	t.Run("leaf named like an existing leaf", func(t *testing.T) {
		require.NoError(t, create(leaf, trustedCluster(root, root.trustToken(t, services.TokenTypeTrustedCluster))))
		tok := root.trustToken(t, services.TokenTypeTrustedCluster)
		other := newClusterEnv(t, "leaf")
		requireKind(t, create(other, trustedCluster(root, tok)), trace.IsAlreadyExists, `cluster "leaf" is already a leaf of this cluster`)
		// The first leaf's CAs are still the ones the root trusts.
		require.Equal(t, leaf.auth.HostCAKeys(), caKeys(t, root.store, "leaf", services.HostCA))
		requireTokenUnspent(t, root, tok)
	})
	t.Run("no oracle of taken names without a token", func(t *testing.T) {
		// "leaf" is a leaf here (above); a caller without a valid token
		// learns nothing about it.
		other := newClusterEnv(t, "leaf")
		req := trustRequest(t, root, "leaf", "0123456789abcdef0123456789abcdef", other)
		_, err := root.auth.RegisterLeafCluster(ctx, req)
		requireKind(t, err, trace.IsAccessDenied, "join token not found or already used")
		req.LeafName = "never-seen"
		_, err2 := root.auth.RegisterLeafCluster(ctx, req)
		require.Equal(t, err.Error(), err2.Error())
	})
	t.Run("wrong root name", func(t *testing.T) {
		tok := root.trustToken(t, services.TokenTypeTrustedCluster)
		tc := trustedCluster(root, tok)
		tc.Metadata.Name = "rooot"
		requireKind(t, create(newClusterEnv(t, "l3"), tc), trace.IsBadParameter, `this cluster is "root": set metadata.name to "root"`)
		requireTokenUnspent(t, root, tok)
	})
	t.Run("man in the middle at proxy_addr", func(t *testing.T) {
		// The leaf's operator has the right token; proxy_addr leads to an
		// attacker's auth server. The pinned TLS fails before the secret
		// is sent, so the attacker learns nothing it could spend.
		tok := root.trustToken(t, services.TokenTypeTrustedCluster)
		mitm := newClusterEnv(t, "root")
		tc := trustedCluster(root, tok)
		tc.Spec.ProxyAddr = mitm.addr
		requireKind(t, create(newClusterEnv(t, "l4"), tc), trace.IsAccessDenied, "CA pin mismatch")
		_, err := mitm.store.GetRemoteCluster(ctx, "l4")
		require.True(t, trace.IsNotFound(err))
		_, got := mitm.audit.find(events.LeafAddFailed, "l4")
		require.False(t, got, "the attacker's server received the request")
		requireTokenUnspent(t, root, tok)
	})
	t.Run("malformed CA keys", func(t *testing.T) {
		tok := root.trustToken(t, services.TokenTypeTrustedCluster)
		other := newClusterEnv(t, "l5")
		for name, mutate := range map[string]func(*struct{ host, user []string }){
			"no host keys":      func(k *struct{ host, user []string }) { k.host = nil },
			"garbage":           func(k *struct{ host, user []string }) { k.user = []string{"ssh-ed25519 AAAA"} },
			"two keys per line": func(k *struct{ host, user []string }) { k.user = []string{k.user[0] + "\n" + k.user[0]} },
			"a certificate": func(k *struct{ host, user []string }) {
				k.host = []string{string(other.identity(t, "n", RoleNode).Files.SSHCert)}
			},
		} {
			req := trustRequest(t, root, "l5", secretOf(t, tok), other)
			k := struct{ host, user []string }{req.HostCAKeys, req.UserCAKeys}
			mutate(&k)
			req.HostCAKeys, req.UserCAKeys = k.host, k.user
			_, err := root.auth.RegisterLeafCluster(ctx, req)
			requireKind(t, err, trace.IsBadParameter, "CA key")
			t.Log(name, err)
		}
		requireTokenUnspent(t, root, tok)
	})
	t.Run("a token without its pin", func(t *testing.T) {
		tc := trustedCluster(root, secretOf(t, root.trustToken(t, services.TokenTypeTrustedCluster)))
		requireKind(t, create(leaf, tc), trace.IsBadParameter, "SECRET@sha256:HEX")
	})
	t.Run("a leaf trusting itself", func(t *testing.T) {
		tc := trustedCluster(leaf, leaf.trustToken(t, services.TokenTypeTrustedCluster))
		requireKind(t, create(leaf, tc), trace.IsBadParameter, "this cluster's own name")
	})
	t.Run("a root naming one of its leaves as its root", func(t *testing.T) {
		// root already has "leaf" as a leaf (above): it may not also
		// trust "leaf" as its root.
		l := newClusterEnv(t, "leaf")
		tc := trustedCluster(l, l.trustToken(t, services.TokenTypeTrustedCluster))
		requireKind(t, create(root, tc), trace.IsAlreadyExists, `cluster "leaf" is already a leaf of this cluster`)
	})
}

func secretOf(t *testing.T, tok string) string {
	s, _, err := services.ParseTrustedClusterToken(tok)
	require.NoError(t, err)
	return s
}

// trustRequest is what a (possibly modified) leaf sends.
func trustRequest(t *testing.T, root *clusterEnv, leafName, tok string, leaf *clusterEnv) authapi.TrustedClusterRequest {
	if s, _, err := services.ParseTrustedClusterToken(tok); err == nil {
		tok = s
	}
	return authapi.TrustedClusterRequest{
		Token: tok, RootName: root.auth.ClusterName(), LeafName: leafName,
		HostCAKeys: leaf.auth.HostCAKeys(), UserCAKeys: leaf.auth.UserCAKeys(),
	}
}

func requireTokenUnspent(t *testing.T, root *clusterEnv, tok string) {
	t.Helper()
	_, err := root.store.CheckToken(context.Background(), secretOf(t, tok), services.TokenTypeTrustedCluster)
	require.NoError(t, err, "the token must not have been spent")
}

// TestLeafTunnelCert: a proxy gets a certificate of role leaf naming
// itself and this cluster, whatever it sends; other roles cannot; a root
// proxy's report of a leaf tunnel sets last_connected (auth's clock) and
// the status, and never creates a leaf.
func TestLeafTunnelCert(t *testing.T) {
	ctx := context.Background()
	root := newClusterEnv(t, "root")
	leaf := newClusterEnv(t, "leaf")
	_, err := leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, root.trustToken(t, services.TokenTypeTrustedCluster)))
	require.NoError(t, err)

	proxy := leaf.client(t, leaf.identity(t, "proxy-7", RoleProxy))
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	certBytes, err := proxy.GenerateLeafTunnelCert(ctx, pub)
	require.NoError(t, err)
	k, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	require.NoError(t, err)
	cert := k.(*ssh.Certificate)
	require.Equal(t, ssh.HostCert, int(cert.CertType))
	require.Equal(t, "proxy-7", cert.KeyId)
	require.Equal(t, RoleLeaf, cert.Extensions[services.CertExtensionHostRole])
	require.Equal(t, "leaf", cert.Extensions[services.CertExtensionCluster])
	// Signed by the leaf's host CA, which the root stored at the exchange.
	require.Equal(t, caKeys(t, root.store, "leaf", services.HostCA)[0], strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert.SignatureKey))))

	node := leaf.client(t, leaf.identity(t, "node-7", RoleNode))
	_, err = node.GenerateLeafTunnelCert(ctx, pub)
	requireKind(t, err, trace.IsAccessDenied, "may not call")

	rootProxy := root.client(t, root.identity(t, "proxy-1", RoleProxy))
	rcs, err := rootProxy.GetRemoteClusters(ctx)
	require.NoError(t, err)
	require.Equal(t, services.RemoteClusterOffline, rcs[0].StatusNow)
	require.NoError(t, rootProxy.TouchRemoteCluster(ctx, "leaf"))
	rcs, err = root.adminClient(t).GetRemoteClusters(ctx)
	require.NoError(t, err)
	require.Equal(t, services.RemoteClusterOnline, rcs[0].StatusNow)
	require.Equal(t, root.clock.Now().UTC(), rcs[0].LastConnected)
	root.clock.Advance(services.RemoteClusterOfflineAfter)
	rcs, err = root.adminClient(t).GetRemoteClusters(ctx)
	require.NoError(t, err)
	require.Equal(t, services.RemoteClusterOffline, rcs[0].StatusNow)
	requireKind(t, rootProxy.TouchRemoteCluster(ctx, "stranger"), trace.IsNotFound, `remote cluster "stranger" not found`)
	rcs, err = root.adminClient(t).GetRemoteClusters(ctx)
	require.NoError(t, err)
	require.Len(t, rcs, 1)
}

// TestHostSignersListLeaves: every certificate response (the password
// login and a web session's certificate) carries the root's host CA first,
// then each leaf's stored host CA, one entry per cluster, sorted; the
// root's CA is never listed to a leaf's own users; a removed leaf's CA is
// gone from the next login.
func TestHostSignersListLeaves(t *testing.T) {
	ctx := context.Background()
	root := newClusterEnv(t, "root")
	leafB := newClusterEnv(t, "zeta")
	leafA := newClusterEnv(t, "alpha")
	for _, leaf := range []*clusterEnv{leafB, leafA} {
		_, err := leaf.adminClient(t).UpsertTrustedCluster(ctx, trustedCluster(root, root.trustToken(t, services.TokenTypeTrustedCluster)))
		require.NoError(t, err)
	}
	logins := 0
	login := func(env *clusterEnv) []authapi.HostSigner {
		t.Helper()
		logins++
		_, err := env.auth.CreateUser(ctx, "alice", []byte("pw"), []string{"alice"}, nil, false)
		if !trace.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
		_, pub, err := utils.GenerateKeyPair()
		require.NoError(t, err)
		sid, token := fmt.Sprintf("sid-%d", logins), "token"
		th := sha256.Sum256([]byte(token))
		resp, err := env.auth.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{
			AuthRequest: authapi.AuthRequest{User: "alice", Password: "pw"}, PublicKey: pub, TTL: time.Hour,
			WebSession: &authapi.WebSessionInit{Key: webSessionKeyOf(sid), TokenHash: th[:]},
		})
		require.NoError(t, err)
		web, err := env.auth.WebSessionCerts(ctx, authapi.WebSessionCertRequest{SessionID: sid, Token: token, PublicKey: pub})
		require.NoError(t, err)
		require.Equal(t, resp.HostSigners, web.HostSigners, "the web session's certificate carries the same host signers")
		return resp.HostSigners
	}

	require.Equal(t, []authapi.HostSigner{
		{ClusterName: "root", CheckingKeys: root.auth.HostCAKeys()},
		{ClusterName: "alpha", CheckingKeys: leafA.auth.HostCAKeys()},
		{ClusterName: "zeta", CheckingKeys: leafB.auth.HostCAKeys()},
	}, login(root))
	require.NotEqual(t, root.auth.HostCAKeys(), leafA.auth.HostCAKeys())

	// A leaf stores its root's host CA, but its own users never get it.
	require.Equal(t, []authapi.HostSigner{{ClusterName: "alpha", CheckingKeys: leafA.auth.HostCAKeys()}}, login(leafA))

	require.NoError(t, root.adminClient(t).DeleteRemoteCluster(ctx, "zeta"))
	require.Equal(t, []authapi.HostSigner{
		{ClusterName: "root", CheckingKeys: root.auth.HostCAKeys()},
		{ClusterName: "alpha", CheckingKeys: leafA.auth.HostCAKeys()},
	}, login(root))
}
