package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// serveImpostor runs a TLS server on loopback that presents chain with key
// and answers every request with 200 {} (it never gets that far when Join
// does its job). It returns the address.
func serveImpostor(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	l, err := netListen()
	require.NoError(t, err)
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{}")) }),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(tls.NewListener(l, srv.TLSConfig)) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return l.Addr().String()
}

// TestJoinRefusesImpostors checks why the pin alone is not enough: an
// impostor can send the real (public) CA certificate next to a leaf of its
// own. Join must verify the leaf against the pinned CA, for server use.
func TestJoinRefusesImpostors(t *testing.T) {
	env := newTestAuth(t)
	other := newTestAuth(t)
	ctx := context.Background()
	realCA := env.auth.tlsCACert.Raw

	// A server certificate from another CA, shipped with our real CA.
	foreign, err := other.auth.issueIdentity(ctx, IdentityRequest{ID: AuthIdentityID, Role: RoleAuth}, []string{JoinServerName}, []net.IP{net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	foreignCert := foreign.TLSCert
	foreignCert.Certificate = append(foreignCert.Certificate, realCA)

	// A node of our own cluster posing as auth: its certificate is signed
	// by the right CA but is for client use only.
	node := env.identity(t, "rogue-node", RoleNode)
	nodeCert := node.TLSCert
	nodeCert.Certificate = append(nodeCert.Certificate, realCA)

	for name, cert := range map[string]tls.Certificate{"foreign leaf": foreignCert, "node leaf": nodeCert} {
		t.Run(name, func(t *testing.T) {
			addr := serveImpostor(t, cert)
			_, err := Join(ctx, JoinParams{
				AuthAddr: addr, Token: "t", CAPin: env.auth.CAPin(), Role: RoleNode,
				Hostname: "victim", Clock: env.clock, Timeout: 10 * time.Second,
			})
			require.Error(t, err)
			require.True(t, trace.IsConnectionProblem(err), "%v", err)
			require.Contains(t, err.Error(), "not signed by the pinned CA")
		})
	}
}

func TestJoinParams(t *testing.T) {
	good := JoinParams{AuthAddr: "a:1", Token: "t", CAPin: "sha256:" + strings.Repeat("0", 64), Role: RoleNode, Hostname: "u"}
	for name, mutate := range map[string]func(p *JoinParams){
		"no addr":  func(p *JoinParams) { p.AuthAddr = "" },
		"no token": func(p *JoinParams) { p.Token = "" },
		"bad role": func(p *JoinParams) { p.Role = RoleAdmin },
		"no pin":   func(p *JoinParams) { p.CAPin = "" },
		"bad pin":  func(p *JoinParams) { p.CAPin = "md5:00" },
	} {
		p := good
		mutate(&p)
		_, err := Join(context.Background(), p)
		require.True(t, trace.IsBadParameter(err), "%s: %v", name, err)
	}
}

// registerReq is a join request with fresh keys.
func registerReq(t *testing.T, token, role, hostname, addr string, extra ...string) authapi.RegisterRequest {
	t.Helper()
	_, sshPub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	key, _, err := generateTLSKey()
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	require.NoError(t, err)
	return authapi.RegisterRequest{Token: token, Role: role, Hostname: hostname, Addr: addr, AdditionalPrincipals: extra, SSHPublicKey: sshPub, TLSPublicKey: der}
}

// TestJoinPrincipals is issue 10 item 2 at the auth server: every extra
// name a join asks for is checked against the identity, the inventory, the
// cluster and the proxy's names; a refusal names the principal and does
// not spend the token; an accepted join gets exactly the derived names
// plus the allowed extras. A proxy (which only a proxy token makes) may
// carry the cluster name and localhost, as its certificate does.
func TestJoinPrincipals(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	store := newTestStore(t, clock)
	srv, err := NewServer(ServerConfig{
		Store: store, ClusterName: testCluster, BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Logger: testLogger()},
		PublicAddrs: []string{"proxy.example.com:3080"},
	})
	require.NoError(t, err)
	ctx := context.Background()
	const victim = "6f1c2a43-1b7e-4f55-9a0e-2d6c1b0f9e11"
	require.NoError(t, store.UpsertNode(ctx, services.Node{UUID: victim, Hostname: "db1", Addr: "10.0.0.7:3022", Cluster: testCluster, Expires: clock.Now().Add(time.Hour)}))
	nodeTok, err := srv.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.NoError(t, err)

	for _, tc := range []struct {
		name     string
		hostname string
		extra    []string
		want     string
	}{
		{"another node's uuid", "h", []string{victim}, victim},
		{"another node's uuid, other case", "h", []string{strings.ToUpper(victim)}, strings.ToUpper(victim)},
		{"another node's hostname", "h", []string{"DB1"}, `"DB1" is the hostname of node "` + victim + `"`},
		{"another node's NAME.CLUSTER", "h", []string{"db1." + testCluster}, "db1." + testCluster},
		{"any uuid", "h", []string{"urn:uuid:00000000-0000-4000-8000-000000000009"}, "urn:uuid:00000000-0000-4000-8000-000000000009"},
		{"the cluster name", "h", []string{testCluster}, `"` + testCluster + `"`},
		{"a proxy's public name", "h", []string{"Proxy.Example.com"}, `"Proxy.Example.com" is a public name of the proxy`},
		{"localhost", "h", []string{"localhost"}, `"localhost"`},
		{"a subdomain of localhost", "h", []string{"a.localhost"}, `"a.localhost"`},
		{"a wildcard", "h", []string{"*.example.com"}, `"*.example.com"`},
		{"a pattern list", "h", []string{"a,b"}, `"a,b"`},
		{"a negation", "h", []string{"!x"}, `"!x"`},
		{"a space", "h", []string{"a b"}, `"a b"`},
		{"an empty one", "h", []string{""}, "empty"},
		{"an IP with a zone", "h", []string{"fe80::1%eth0"}, `"fe80::1%eth0"`},
		{"hundreds", "h", manyNames(maxExtraPrincipals + 1), "at most 128"},
		{"hostname is a proxy's public name", "proxy.example.com", nil, `hostname "proxy.example.com" is a public name of the proxy`},
		{"hostname is the cluster", testCluster, nil, "is the name of cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := srv.RegisterUsingToken(ctx, registerReq(t, nodeTok.Name, RoleNode, tc.hostname, "", tc.extra...))
			requireKind(t, err, trace.IsBadParameter, tc.want)
		})
	}
	// Without a good token the names are not even looked at (no inventory
	// read for an unauthenticated caller): the token is what is refused.
	_, err = srv.RegisterUsingToken(ctx, registerReq(t, "0123456789abcdef0123456789abcdef", RoleNode, "h", "", victim))
	requireKind(t, err, trace.IsAccessDenied, "not found or already used")
	_, err = srv.RegisterUsingToken(ctx, authapi.RegisterRequest{Token: nodeTok.Name, Role: RoleNode, UUID: victim})
	requireKind(t, err, trace.IsBadParameter, `join request carries uuid "`+victim+`": the auth server assigns host UUIDs`)
	_, err = store.GetToken(ctx, nodeTok.Name)
	require.NoError(t, err, "no refusal spent the token")

	// A node: derived names, then the extras it may hold (IPs even when
	// other hosts share them, its own names given again are not repeated).
	resp, err := srv.RegisterUsingToken(ctx, registerReq(t, nodeTok.Name, RoleNode, "web1", "10.0.0.7:3022",
		"10.0.0.8", "web1", "WEB1."+strings.ToUpper(testCluster), "web1.example.com", "2001:db8::1"))
	require.NoError(t, err)
	cert := parseSSHCert(t, resp.SSHCert)
	id := resp.UUID
	require.NotEqual(t, victim, id)
	require.Equal(t, id, cert.KeyId)
	require.Equal(t, []string{id, "web1", id + "." + testCluster, "web1." + testCluster,
		"10.0.0.8", "web1.example.com", "2001:db8::1", "10.0.0.7"}, cert.ValidPrincipals)
	leaf, err := parseCertPEM(resp.TLSCert)
	require.NoError(t, err)
	require.Equal(t, id, leaf.Subject.CommonName)

	// Each join mints a new UUID: two hosts sharing a multi-use token
	// are two hosts.
	multi := services.Token{Name: "multi-use-token", Type: services.TokenTypeNode, Expires: clock.Now().Add(time.Hour), MultiUse: true}
	require.NoError(t, store.CreateToken(ctx, multi))
	r1, err := srv.RegisterUsingToken(ctx, registerReq(t, multi.Name, RoleNode, "twin", ""))
	require.NoError(t, err)
	r2, err := srv.RegisterUsingToken(ctx, registerReq(t, multi.Name, RoleNode, "twin", ""))
	require.NoError(t, err)
	require.NotEqual(t, r1.UUID, r2.UUID)

	// A proxy may carry the cluster name and localhost.
	proxyTok, err := srv.CreateToken(ctx, services.TokenTypeProxy, time.Hour)
	require.NoError(t, err)
	resp, err = srv.RegisterUsingToken(ctx, registerReq(t, proxyTok.Name, RoleProxy, "proxy-2", "",
		"127.0.0.1", "::1", "localhost", testCluster, "proxy.example.com"))
	require.NoError(t, err)
	require.NotEqual(t, id, resp.UUID)
	cert = parseSSHCert(t, resp.SSHCert)
	require.Equal(t, []string{resp.UUID, "proxy-2", resp.UUID + "." + testCluster, "proxy-2." + testCluster,
		"127.0.0.1", "::1", "localhost", testCluster, "proxy.example.com"}, cert.ValidPrincipals)
}

func manyNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.1.%d.%d", i/256, i%256)
	}
	return out
}
