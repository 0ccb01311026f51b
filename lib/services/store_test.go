package services

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backend/memory"
)

func newTestStore(t testing.TB, clock clockwork.Clock) *Store {
	t.Helper()
	b, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return NewStore(b)
}

func testPublicKey(t *testing.T) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sp, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return string(ssh.MarshalAuthorizedKey(sp))
}

func TestStoreNodes(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)

	n1 := Node{UUID: "u1", Hostname: "web", Addr: "10.0.0.1:3022", Cluster: "c1", Labels: map[string]string{"env": "prod"},
		Expires: clock.Now().Add(time.Minute), LastHeartbeat: clock.Now()}
	n2 := Node{UUID: "u2", Hostname: "db", Addr: "10.0.0.2:3022", Cluster: "c1", Expires: clock.Now().Add(time.Hour)}
	n3 := Node{UUID: "u3", Hostname: "db", Addr: "10.0.0.3:3022", Cluster: "c10"}
	for _, n := range []Node{n1, n2, n3} {
		require.NoError(t, s.UpsertNode(ctx, n))
	}
	got, err := s.GetNode(ctx, "c1", "u1")
	require.NoError(t, err)
	require.Equal(t, n1.Labels, got.Labels)
	require.True(t, n1.Expires.Equal(got.Expires))

	// The backend item carries the node's expiry.
	item, err := s.Backend().Get(ctx, NodeKey("c1", "u1"))
	require.NoError(t, err)
	require.True(t, item.Expires.Equal(n1.Expires))

	nodes, err := s.GetNodes(ctx, "c1")
	require.NoError(t, err)
	require.Len(t, nodes, 2, "prefix of c1 must not include c10")
	nodes, err = s.GetNodes(ctx, "")
	require.NoError(t, err)
	require.Len(t, nodes, 3)

	clock.Advance(2 * time.Minute)
	_, err = s.GetNode(ctx, "c1", "u1")
	require.True(t, trace.IsNotFound(err), "expired node: %v", err)
	require.EqualError(t, err, `node "u1" not found in cluster "c1"`)

	require.NoError(t, s.DeleteNode(ctx, "c1", "u2"))
	require.True(t, trace.IsNotFound(s.DeleteNode(ctx, "c1", "u2")))

	err = s.UpsertNode(ctx, Node{UUID: "x/y", Addr: "h:1", Cluster: "c1"})
	require.True(t, trace.IsBadParameter(err), "%v", err)
	err = s.UpsertNode(ctx, Node{UUID: "x", Addr: "h", Cluster: "c1"})
	require.True(t, trace.IsBadParameter(err), "%v", err)
}

func TestStoreUsersRoles(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewFakeClock())

	u := User{Name: "alice", Traits: map[string][]string{TraitLogins: {"alice", "root"}}}
	require.NoError(t, s.CreateUser(ctx, u))
	err := s.CreateUser(ctx, u)
	require.True(t, trace.IsAlreadyExists(err))
	require.EqualError(t, err, `user "alice" already exists`)
	got, err := s.GetUser(ctx, "alice")
	require.NoError(t, err)
	require.Equal(t, []string{PresetAccessRole}, got.Roles, "default role")
	require.NoError(t, s.UpsertUser(ctx, User{Name: "bob", Roles: []string{"admin"}}))
	users, err := s.GetUsers(ctx)
	require.NoError(t, err)
	require.Len(t, users, 2)
	require.NoError(t, s.DeleteUser(ctx, "bob"))
	_, err = s.GetUser(ctx, "bob")
	require.True(t, trace.IsNotFound(err))
	require.True(t, trace.IsBadParameter(s.CreateUser(ctx, User{Name: "../etc"})))

	for _, r := range PresetRoles() {
		require.NoError(t, s.UpsertRole(ctx, r))
	}
	roles, err := s.GetRoles(ctx)
	require.NoError(t, err)
	require.Len(t, roles, 2)
	access, err := s.GetRole(ctx, "access")
	require.NoError(t, err)
	require.Equal(t, PresetRoles()[0], access)
	require.True(t, trace.IsBadParameter(s.UpsertRole(ctx, &Role{Metadata: Metadata{Name: "x"}, Spec: RoleSpec{Logins: []string{"{{internal.foo}}"}}})))
	require.NoError(t, s.DeleteRole(ctx, "access"))
	_, err = s.GetRole(ctx, "access")
	require.EqualError(t, err, `role "access" not found`)
}

func TestPresetRoles(t *testing.T) {
	roles := PresetRoles()
	require.Len(t, roles, 2)
	node := &Node{Hostname: "any", Labels: map[string]string{"env": "prod"}}
	for _, r := range roles {
		c := NewAccessChecker([]*Role{r}, map[string][]string{TraitLogins: {"alice"}})
		require.NoError(t, c.CheckAccessToNode(node, "alice"), r.Metadata.Name)
		require.Error(t, c.CheckAccessToNode(node, "root"), r.Metadata.Name)
		require.True(t, c.CanForwardAgent(node))
		require.True(t, c.CanPortForward(node))
		require.Equal(t, r.Metadata.Name == PresetAdminRole, c.IsAdmin())
	}
	// Fresh copies: mutating one does not affect the next call.
	roles[0].Spec.Logins = nil
	require.NotEmpty(t, PresetRoles()[0].Spec.Logins)
}

func TestStoreCertAuthorities(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewFakeClock())
	ca := CertAuthority{Type: HostCA, ClusterName: "c1", SSHPublicKeys: []string{testPublicKey(t)},
		SSHPrivateKeys: [][]byte{[]byte("secret")}, TLSCert: []byte("cert"), TLSKey: []byte("key")}
	require.NoError(t, s.CreateCertAuthority(ctx, ca))
	require.True(t, trace.IsAlreadyExists(s.CreateCertAuthority(ctx, ca)))
	got, err := s.GetCertAuthority(ctx, "c1", HostCA, false)
	require.NoError(t, err)
	require.Nil(t, got.SSHPrivateKeys)
	require.Nil(t, got.TLSKey)
	require.Equal(t, ca.TLSCert, got.TLSCert)
	got, err = s.GetCertAuthority(ctx, "c1", HostCA, true)
	require.NoError(t, err)
	require.Equal(t, ca.SSHPrivateKeys, got.SSHPrivateKeys)
	_, err = s.GetCertAuthority(ctx, "c1", UserCA, true)
	require.True(t, trace.IsNotFound(err))
	cas, err := s.GetCertAuthorities(ctx, HostCA, false)
	require.NoError(t, err)
	require.Len(t, cas, 1)
	require.Nil(t, cas[0].SSHPrivateKeys)
	require.True(t, trace.IsBadParameter(s.CreateCertAuthority(ctx, CertAuthority{Type: UserCA, ClusterName: "c1"})))
}

func TestStoreNetworking(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewFakeClock())
	c, err := s.GetClusterNetworkingConfig(ctx)
	require.NoError(t, err)
	require.Equal(t, RoutingUnambiguousMatch, c.Spec.RoutingStrategy)
	require.Equal(t, DefaultSSHDialTimeout, c.Spec.SSHDialTimeout.Value())
	c.Spec.RoutingStrategy = RoutingMostRecent
	c.Spec.SSHDialTimeout = Duration(time.Second)
	require.NoError(t, s.SetClusterNetworkingConfig(ctx, c))
	c2, err := s.GetClusterNetworkingConfig(ctx)
	require.NoError(t, err)
	require.Equal(t, c, c2)
	err = s.SetClusterNetworkingConfig(ctx, &ClusterNetworkingConfig{Spec: ClusterNetworkingConfigSpec{RoutingStrategy: "random"}})
	require.True(t, trace.IsBadParameter(err))
}

func TestStoreTokens(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)
	exp := clock.Now().Add(30 * time.Minute)
	require.NoError(t, s.CreateToken(ctx, Token{Name: "tok1", Type: TokenTypeNode, Expires: exp}))
	require.True(t, trace.IsAlreadyExists(s.CreateToken(ctx, Token{Name: "tok1", Type: TokenTypeNode, Expires: exp})))
	require.True(t, trace.IsBadParameter(s.CreateToken(ctx, Token{Name: "tok2", Type: "auth", Expires: exp})))
	require.True(t, trace.IsBadParameter(s.CreateToken(ctx, Token{Name: "tok2", Type: TokenTypeNode})))

	_, err := s.ConsumeToken(ctx, "tok1", TokenTypeProxy)
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	tok, err := s.ConsumeToken(ctx, "tok1", TokenTypeNode)
	require.NoError(t, err)
	require.Equal(t, "tok1", tok.Name)
	_, err = s.ConsumeToken(ctx, "tok1", TokenTypeNode)
	require.True(t, trace.IsAccessDenied(err))
	require.EqualError(t, err, "join token not found or already used")
	_, err = s.ConsumeToken(ctx, "nope", TokenTypeNode)
	require.EqualError(t, err, "join token not found or already used")

	// Expired, but still in the backend: the message says so.
	require.NoError(t, s.CreateToken(ctx, Token{Name: "old", Type: TokenTypeNode, Expires: exp}))
	clock.Advance(31 * time.Minute)
	_, err = s.ConsumeToken(ctx, "old", TokenTypeNode)
	require.True(t, trace.IsAccessDenied(err))
	require.EqualError(t, err, "join token expired")

	// Multi-use survives.
	require.NoError(t, s.CreateToken(ctx, Token{Name: "multi", Type: TokenTypeProxy, Expires: clock.Now().Add(time.Hour), MultiUse: true}))
	for range 3 {
		_, err := s.ConsumeToken(ctx, "multi", TokenTypeProxy)
		require.NoError(t, err)
	}
	toks, err := s.GetTokens(ctx)
	require.NoError(t, err)
	require.Len(t, toks, 2) // old (in grace) and multi
	require.NoError(t, s.DeleteToken(ctx, "multi"))
	_, err = s.GetToken(ctx, "multi")
	require.True(t, trace.IsNotFound(err))
}

func TestConsumeTokenConcurrent(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewRealClock())
	for round := range 20 {
		name := "race" + string(rune('a'+round))
		require.NoError(t, s.CreateToken(ctx, Token{Name: name, Type: TokenTypeNode, Expires: time.Now().Add(time.Hour)}))
		const joiners = 16
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins, denied := 0, 0
		start := make(chan struct{})
		for range joiners {
			wg.Go(func() {
				<-start
				_, err := s.ConsumeToken(ctx, name, TokenTypeNode)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					wins++
				} else if trace.IsAccessDenied(err) && err.Error() == msgTokenNotFound {
					denied++
				}
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, 1, wins, "round %d", round)
		require.Equal(t, joiners-1, denied, "round %d", round)
	}
}

func TestParseNodeKey(t *testing.T) {
	c, u, ok := ParseNodeKey(NodeKey("c1", "u1"))
	require.True(t, ok)
	require.Equal(t, "c1", c)
	require.Equal(t, "u1", u)
	for _, k := range []string{"/nodes/c1", "/nodes//u", "/users/a/b", "/nodes/c/u/x"} {
		_, _, ok := ParseNodeKey(k)
		require.False(t, ok, k)
	}
}

// TestStoreProxies: proxy records expire with their heartbeat, list per
// cluster sorted by UUID, and bad records are refused naming the field.
func TestStoreProxies(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)
	p1 := Proxy{UUID: "p2", Hostname: "edge-2", Cluster: "c1", TunnelAddr: "10.0.0.2:3024", Expires: clock.Now().Add(time.Minute)}
	p2 := Proxy{UUID: "p1", Hostname: "edge-1", Cluster: "c1", TunnelAddr: "10.0.0.1:3024", SSHAddr: "10.0.0.1:3023", Expires: clock.Now().Add(time.Hour)}
	p3 := Proxy{UUID: "p3", Cluster: "c10", Expires: clock.Now().Add(time.Hour)}
	for _, p := range []Proxy{p1, p2, p3} {
		require.NoError(t, s.UpsertProxy(ctx, p))
	}
	got, err := s.GetProxies(ctx, "c1")
	require.NoError(t, err)
	require.Len(t, got, 2, "prefix of c1 must not include c10")
	require.Equal(t, "p1", got[0].UUID)
	require.Equal(t, "10.0.0.1:3023", got[0].SSHAddr)

	clock.Advance(2 * time.Minute)
	got, err = s.GetProxies(ctx, "c1")
	require.NoError(t, err)
	require.Len(t, got, 1, "the expired proxy left the list")
	require.NoError(t, s.DeleteProxy(ctx, "c1", "p1"))
	got, err = s.GetProxies(ctx, "")
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "p3", got[0].UUID)
	require.Equal(t, "p3", got[0].Hostname, "hostname defaults to the UUID")

	err = s.UpsertProxy(ctx, Proxy{UUID: "x", Cluster: "c1", TunnelAddr: "nohostport"})
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), "tunnel_addr")
	err = s.UpsertProxy(ctx, Proxy{UUID: "x/y", Cluster: "c1"})
	require.True(t, trace.IsBadParameter(err), "%v", err)
}
