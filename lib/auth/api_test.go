package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

func joinParams(env *testEnv, token, role, hostname string) JoinParams {
	return JoinParams{
		AuthAddr: env.addr, Token: token, CAPin: env.auth.CAPin(), Role: role,
		Hostname: hostname, Addr: "127.0.0.1:3022", Clock: env.clock,
		Timeout: 10 * time.Second,
	}
}

func TestJoinAndUseIdentity(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	tok, err := env.auth.CreateToken(ctx, services.TokenTypeNode, 0)
	require.NoError(t, err)
	require.Regexp(t, `^[0-9a-f]{32}$`, tok.Name)

	id, err := Join(ctx, joinParams(env, tok.Name, RoleNode, "node-1-host"))
	require.NoError(t, err)
	// The auth server minted the UUID: the TLS CN and the SSH KeyId.
	_, err = uuid.Parse(id.ID)
	require.NoError(t, err, "minted UUID %q", id.ID)
	require.Equal(t, id.ID, id.SSHCert.KeyId)
	require.Equal(t, RoleNode, id.Role)
	require.Equal(t, testCluster, id.ClusterName)
	require.Equal(t, []string{id.ID, "node-1-host", id.ID + "." + testCluster, "node-1-host." + testCluster, "127.0.0.1"}, id.SSHCert.ValidPrincipals)

	// The identity survives a round trip through disk and works.
	dir := t.TempDir() + "/node"
	require.NoError(t, WriteIdentity(dir, id))
	id, err = ReadIdentity(dir)
	require.NoError(t, err)
	clt := env.client(t, id)
	cluster, err := clt.Ping(ctx)
	require.NoError(t, err)
	require.Equal(t, testCluster, cluster)

	// The token was single use.
	_, err = Join(ctx, joinParams(env, tok.Name, RoleNode, "node-2"))
	requireKind(t, err, trace.IsAccessDenied, "not found or already used")
}

func TestJoinTokenSingleUseUnderConcurrency(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	tok, err := env.auth.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.NoError(t, err)
	const n = 5
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = Join(ctx, joinParams(env, tok.Name, RoleNode, "racer-"+string(rune('a'+i))))
		}()
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		if err == nil {
			wins++
			continue
		}
		requireKind(t, err, trace.IsAccessDenied, "not found or already used")
	}
	require.Equal(t, 1, wins)
}

func TestJoinExpiredAndWrongTypeTokens(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	expiring, err := env.auth.CreateToken(ctx, services.TokenTypeNode, time.Minute)
	require.NoError(t, err)
	proxyTok, err := env.auth.CreateToken(ctx, services.TokenTypeProxy, time.Hour)
	require.NoError(t, err)

	env.clock.Advance(2 * time.Minute)
	_, err = Join(ctx, joinParams(env, expiring.Name, RoleNode, "late"))
	requireKind(t, err, trace.IsAccessDenied, "expired")

	// Wrong type: refused, and the token is not spent.
	_, err = Join(ctx, joinParams(env, proxyTok.Name, RoleNode, "sneaky"))
	requireKind(t, err, trace.IsAccessDenied, "cannot be used to join as node")
	_, err = env.store.GetToken(ctx, proxyTok.Name)
	require.NoError(t, err)
	id, err := Join(ctx, joinParams(env, proxyTok.Name, RoleProxy, "proxy-1"))
	require.NoError(t, err)
	require.Equal(t, RoleProxy, id.Role)

	// A malformed request does not burn the token either.
	good, err := env.auth.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.NoError(t, err)
	_, err = env.auth.RegisterUsingToken(ctx, authapi.RegisterRequest{Token: good.Name, Role: RoleNode, Hostname: "n", SSHPublicKey: []byte("junk")})
	require.True(t, trace.IsBadParameter(err), "%v", err)
	_, err = env.store.GetToken(ctx, good.Name)
	require.NoError(t, err)
}

func TestJoinCAPinMismatch(t *testing.T) {
	env := newTestAPI(t)
	other := newTestAuth(t) // another cluster's CA
	ctx := context.Background()
	tok, err := env.auth.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.NoError(t, err)

	p := joinParams(env, tok.Name, RoleNode, "victim")
	p.CAPin = other.auth.CAPin()
	_, err = Join(ctx, p)
	requireKind(t, err, trace.IsAccessDenied, "CA pin mismatch")
	require.Contains(t, err.Error(), other.auth.CAPin())
	require.Contains(t, err.Error(), env.auth.CAPin())
	// The request never reached the server: the token is intact.
	_, err = env.store.GetToken(ctx, tok.Name)
	require.NoError(t, err)

	p.CAPin = "sha256:nothex"
	_, err = Join(ctx, p)
	require.True(t, trace.IsBadParameter(err), "%v", err)
	p.CAPin = ""
	_, err = Join(ctx, p)
	require.True(t, trace.IsBadParameter(err), "%v", err)
}

// rawGet does GET path with the given TLS config and returns status and body.
func rawGet(t *testing.T, env *testEnv, cfg *tls.Config, path string) (int, string, error) {
	t.Helper()
	cfg.Time = env.clock.Now
	tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + env.addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

func TestNoClientCertOnlyJoin(t *testing.T) {
	env := newTestAPI(t)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.auth.TLSCACertPEM())

	// Without a client certificate the handshake is refused for every
	// endpoint outside the join name.
	for _, path := range []string{"/v1/ping", "/v1/users", "/v1/join"} {
		_, _, err := rawGet(t, env, &tls.Config{RootCAs: pool, ServerName: AuthServerName}, path)
		require.Error(t, err, path)
		require.Contains(t, err.Error(), "certificate required", path)
	}
	// A certificate from another cluster's CA is refused too.
	other := newTestAuth(t)
	foreign := other.identity(t, "intruder", RoleAdmin)
	cfg := foreign.ClientTLSConfig()
	cfg.RootCAs = pool
	_, _, err := rawGet(t, env, cfg, "/v1/ping")
	require.Error(t, err)

	// Under the join name, only the join endpoint exists.
	status, _, err := rawGet(t, env, &tls.Config{RootCAs: pool, ServerName: JoinServerName}, "/v1/ping")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status)
	status, _, err = rawGet(t, env, &tls.Config{RootCAs: pool, ServerName: JoinServerName}, "/v1/users")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status)
	// The join endpoint itself only takes POST.
	status, _, err = rawGet(t, env, &tls.Config{RootCAs: pool, ServerName: JoinServerName}, "/v1/join")
	require.NoError(t, err)
	require.Equal(t, http.StatusMethodNotAllowed, status)

	// The server certificate verifies under the fixed name, loopback and
	// localhost.
	for _, name := range []string{AuthServerName, "127.0.0.1", "localhost"} {
		admin, err := ReadIdentity(env.adminDir)
		require.NoError(t, err)
		cfg := admin.ClientTLSConfig()
		cfg.ServerName = name
		status, body, err := rawGet(t, env, cfg, "/v1/ping")
		require.NoError(t, err, name)
		require.Equal(t, http.StatusOK, status, body)
	}
}

func TestNodeAuthorization(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	hn := env.newHostNode(t, "node-a", RoleNode)
	node := env.client(t, hn.id)

	ping, err := node.PingDetails(ctx)
	require.NoError(t, err)
	require.Equal(t, authapi.PingResponse{ClusterName: testCluster, ID: "node-a", Role: RoleNode}, *ping)

	// Its own heartbeat: yes. Another node's: no.
	require.NoError(t, node.UpsertNode(ctx, services.Node{UUID: "node-a", Hostname: "a", Addr: hn.addr, Expires: env.clock.Now().Add(time.Minute)}))
	got, err := env.store.GetNode(ctx, testCluster, "node-a")
	require.NoError(t, err)
	require.Equal(t, "a", got.Hostname)
	err = node.UpsertNode(ctx, services.Node{UUID: "node-b", Hostname: "b", Addr: hn.addr, Expires: env.clock.Now().Add(time.Minute)})
	requireKind(t, err, trace.IsAccessDenied, `may not announce node "node-b"`)
	_, err = env.store.GetNode(ctx, testCluster, "node-b")
	require.True(t, trace.IsNotFound(err))
	err = node.UpsertNode(ctx, services.Node{UUID: "node-a", Cluster: "elsewhere", Addr: hn.addr, Expires: env.clock.Now().Add(time.Minute)})
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	// Reads a node needs.
	ca, err := node.GetCertAuthority(ctx, testCluster, services.UserCA, false)
	require.NoError(t, err)
	require.Equal(t, env.auth.UserCAKeys(), ca.SSHPublicKeys)
	require.Empty(t, ca.SSHPrivateKeys)
	hostCA, err := node.GetCertAuthority(ctx, testCluster, services.HostCA, false)
	require.NoError(t, err)
	require.Empty(t, hostCA.SSHPrivateKeys)
	require.Empty(t, hostCA.TLSKey)
	_, err = node.GetCertAuthority(ctx, testCluster, services.UserCA, true)
	require.True(t, trace.IsBadParameter(err))
	role, err := node.GetRole(ctx, services.PresetAccessRole)
	require.NoError(t, err)
	require.Equal(t, services.PresetAccessRole, role.Metadata.Name)

	// The networking config: readable (it holds session_recording and
	// record_input, which the node applies), not writable.
	_, err = node.GetClusterNetworkingConfig(ctx)
	require.NoError(t, err)
	err = node.SetClusterNetworkingConfig(ctx, services.DefaultClusterNetworkingConfig())
	requireKind(t, err, trace.IsAccessDenied, "may not call")
	// Everything else: denied.
	_, err = node.CreateUser(ctx, "eve", []byte("pw"), []string{"root"}, nil, false)
	requireKind(t, err, trace.IsAccessDenied, "may not call")
	_, err = node.GetNodes(ctx, "")
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	_, err = node.GenerateUserCert(ctx, authapi.UserCertRequest{User: "x"})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	_, err = node.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.True(t, trace.IsAccessDenied(node.UpsertRole(ctx, role)))
	_, err = node.NewWatcher(ctx, backend.Watch{})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	_, err = node.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	_, err = env.store.GetUser(ctx, "eve")
	require.True(t, trace.IsNotFound(err))
}

func TestAdminAndErrorKindsOverTheWire(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	admin := env.adminClient(t)

	url, err := admin.CreateUser(ctx, "hank", []byte("pw"), []string{"hank"}, []string{"admin"}, true)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(url, "otpauth://"), url)
	_, err = admin.CreateUser(ctx, "hank", []byte("pw"), nil, nil, false)
	requireKind(t, err, trace.IsAlreadyExists, `user "hank" already exists`)
	_, err = admin.GetRole(ctx, "nope")
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = admin.CreateToken(ctx, "bogus", time.Hour)
	require.True(t, trace.IsBadParameter(err), "%v", err)

	users, err := admin.GetUsers(ctx)
	require.NoError(t, err)
	require.Len(t, users, 1)
	require.Empty(t, users[0].PasswordHash)
	require.Empty(t, users[0].TOTPSecret)
	require.NoError(t, admin.DeleteUser(ctx, "hank"))
	require.True(t, trace.IsNotFound(admin.DeleteUser(ctx, "hank")))

	role := &services.Role{Metadata: services.Metadata{Name: "ops"}, Spec: services.RoleSpec{Logins: []string{"ops"}, NodeLabels: map[string]services.LabelValues{"env": {"prod"}}}}
	require.NoError(t, admin.UpsertRole(ctx, role))
	roles, err := admin.GetRoles(ctx)
	require.NoError(t, err)
	require.Len(t, roles, 3)
	require.NoError(t, admin.DeleteRole(ctx, "ops"))

	tok, err := admin.CreateToken(ctx, services.TokenTypeProxy, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, env.clock.Now().Add(10*time.Minute).UTC(), tok.Expires)
	tokens, err := admin.GetTokens(ctx)
	require.NoError(t, err)
	require.Len(t, tokens, 1)
	require.NoError(t, admin.DeleteToken(ctx, tok.Name))

	netCfg, err := admin.GetClusterNetworkingConfig(ctx)
	require.NoError(t, err)
	netCfg.Spec.RoutingStrategy = services.RoutingMostRecent
	require.NoError(t, admin.SetClusterNetworkingConfig(ctx, netCfg))
	netCfg, err = admin.GetClusterNetworkingConfig(ctx)
	require.NoError(t, err)
	require.Equal(t, services.RoutingMostRecent, netCfg.Spec.RoutingStrategy)
	netCfg.Spec.RoutingStrategy = "random"
	require.True(t, trace.IsBadParameter(admin.SetClusterNetworkingConfig(ctx, netCfg)))

	require.NoError(t, admin.UpsertNode(ctx, services.Node{UUID: "n1", Cluster: testCluster, Hostname: "n1", Addr: "127.0.0.1:3022", Expires: env.clock.Now().Add(time.Minute)}))
	nodes, err := admin.GetNodes(ctx, testCluster)
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	require.NoError(t, admin.DeleteNode(ctx, testCluster, "n1"))
	require.True(t, trace.IsNotFound(admin.DeleteNode(ctx, testCluster, "n1")))

	// pctl auth sign.
	_, err = admin.CreateUser(ctx, "robot", []byte("pw"), []string{"ci"}, nil, false)
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	cert, err := admin.GenerateUserCert(ctx, authapi.UserCertRequest{User: "robot", PublicKey: pub, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, []string{"ci"}, parseSSHCert(t, cert).ValidPrincipals)
}

func TestProxyLoginAndRateLimitOverTheWire(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))
	_, err := env.auth.CreateUser(ctx, "ivy", []byte("pw"), []string{"ivy"}, nil, false)
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)

	resp, err := proxy.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{AuthRequest: authapi.AuthRequest{User: "ivy", Password: "pw", RemoteAddr: "198.51.100.1:1"}, PublicKey: pub, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, "ivy", resp.Username)
	require.Equal(t, []string{"ivy"}, parseSSHCert(t, resp.Cert).ValidPrincipals)
	user, err := proxy.AuthenticateUser(ctx, authapi.AuthRequest{User: "ivy", Password: "pw"})
	require.NoError(t, err)
	require.Equal(t, "ivy", user.Name)

	for range DefaultMaxLoginFailures {
		_, err := proxy.AuthenticateUser(ctx, authapi.AuthRequest{User: "ivy", Password: "bad", RemoteAddr: "198.51.100.2:1"})
		requireKind(t, err, trace.IsAccessDenied, "invalid credentials")
	}
	// Locked out from that address, not from another one.
	_, err = proxy.AuthenticateUser(ctx, authapi.AuthRequest{User: "ivy", Password: "pw", RemoteAddr: "198.51.100.2:2"})
	requireKind(t, err, trace.IsLimitExceeded, "try again in")
	_, err = proxy.AuthenticateUser(ctx, authapi.AuthRequest{User: "ivy", Password: "pw", RemoteAddr: "198.51.100.3:1"})
	require.NoError(t, err)

	// A proxy lists nodes but cannot administer.
	_, err = proxy.GetNodes(ctx, "")
	require.NoError(t, err)
	_, err = proxy.GetUsers(ctx)
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.True(t, trace.IsAccessDenied(proxy.DeleteNode(ctx, testCluster, "x")))
}

func TestWatchNodes(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))

	w, err := proxy.NewWatcher(ctx, backend.Watch{Prefixes: []string{services.NodesPrefix()}})
	require.NoError(t, err)
	defer w.Close()
	next := func() backend.Event {
		t.Helper()
		select {
		case ev := <-w.Events():
			return ev
		case <-w.Done():
			t.Fatalf("watcher stopped: %v", w.Error())
		case <-time.After(10 * time.Second):
			t.Fatal("timed out waiting for a watch event")
		}
		return backend.Event{}
	}
	require.Equal(t, backend.OpInit, next().Type)

	// Writes outside the nodes prefix are not streamed.
	_, err = env.auth.CreateUser(ctx, "jack", []byte("pw"), nil, nil, false)
	require.NoError(t, err)
	node := services.Node{UUID: "n1", Hostname: "web", Addr: "127.0.0.1:3022", Cluster: testCluster, Expires: env.clock.Now().Add(time.Minute)}
	require.NoError(t, env.store.UpsertNode(ctx, node))
	ev := next()
	require.Equal(t, backend.OpPut, ev.Type)
	require.Equal(t, services.NodeKey(testCluster, "n1"), ev.Item.Key)
	require.Contains(t, string(ev.Item.Value), `"hostname":"web"`)
	require.NoError(t, env.store.DeleteNode(ctx, testCluster, "n1"))
	ev = next()
	require.Equal(t, backend.OpDelete, ev.Type)
	require.Equal(t, services.NodeKey(testCluster, "n1"), ev.Item.Key)

	nodes, err := proxy.GetNodes(ctx, testCluster)
	require.NoError(t, err)
	require.Empty(t, nodes)

	_, err = proxy.NewWatcher(ctx, backend.Watch{Prefixes: []string{"/users/"}})
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	require.NoError(t, w.Close())
	require.NoError(t, w.Close())
	require.NoError(t, w.Error())
}

func TestWatchEndsWhenServerCloses(t *testing.T) {
	env := newTestAuth(t)
	api := startAPI(t, env)
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))
	w, err := proxy.NewWatcher(context.Background(), backend.Watch{})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)
	require.NoError(t, api.Close())
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("watcher did not notice the server closing")
	}
	require.Error(t, w.Error())
}

func TestClientConfig(t *testing.T) {
	_, err := NewClient(ClientConfig{})
	require.True(t, trace.IsBadParameter(err))
	_, err = NewClient(ClientConfig{Addr: "x:1"})
	require.True(t, trace.IsBadParameter(err))
	// An unreachable server is a connection problem.
	env := newTestAuth(t)
	l, err := netListen()
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	clt, err := NewClient(ClientConfig{Addr: addr, Identity: env.identity(t, "n", RoleNode), Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	defer clt.Close()
	_, err = clt.Ping(context.Background())
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
}

// accessPoint mirrors srv.AccessPoint (lib/auth must not import lib/srv).
type accessPoint interface {
	GetCertAuthority(ctx context.Context, clusterName string, t services.CertAuthType, withSecrets bool) (*services.CertAuthority, error)
	GetRole(ctx context.Context, name string) (*services.Role, error)
}

var (
	_ accessPoint = (*Client)(nil)
	_ accessPoint = (*services.Store)(nil)
)

// TestRemoteNodeWatcher runs the services.NodeWatcher of a remote proxy on
// the auth client: heartbeats sent by a node over the API reach it.
func TestRemoteNodeWatcher(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))
	hn := env.newHostNode(t, "node-1", RoleNode)
	node := env.client(t, hn.id)
	require.NoError(t, node.UpsertNode(ctx, services.Node{UUID: "node-1", Hostname: "early", Addr: hn.addr, Expires: env.clock.Now().Add(time.Minute)}))

	nw, err := services.NewNodeWatcher(services.NodeWatcherConfig{Events: proxy, Clock: env.clock, Logger: testLogger()})
	require.NoError(t, err)
	defer nw.Close()
	found, err := nw.Find(ctx, services.NodeQuery{Cluster: testCluster, Host: "early"})
	require.NoError(t, err)
	require.Len(t, found, 1)

	// A later heartbeat with a new hostname arrives through the watch.
	require.NoError(t, node.UpsertNode(ctx, services.Node{UUID: "node-1", Hostname: "renamed", Addr: hn.addr, Expires: env.clock.Now().Add(time.Minute)}))
	require.Eventually(t, func() bool {
		found, err := nw.Find(ctx, services.NodeQuery{Cluster: testCluster, Host: "renamed"})
		return err == nil && len(found) == 1
	}, 10*time.Second, 10*time.Millisecond)
}

func TestJoinFailuresAreRateLimited(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	for range maxJoinFailures {
		_, err := Join(ctx, joinParams(env, "0123456789abcdef0123456789abcdef", RoleNode, "guesser"))
		requireKind(t, err, trace.IsAccessDenied, "not found or already used")
	}
	// Even a good token is refused from this address for a while.
	tok, err := env.auth.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.NoError(t, err)
	_, err = Join(ctx, joinParams(env, tok.Name, RoleNode, "late"))
	requireKind(t, err, trace.IsLimitExceeded, "try again in")
	env.clock.Advance(DefaultLoginWindow)
	_, err = Join(ctx, joinParams(env, tok.Name, RoleNode, "late"))
	require.NoError(t, err)
}

// TestShutdownEndsWatches: a graceful shutdown does not wait forever for
// a watch stream, which is never idle.
func TestShutdownEndsWatches(t *testing.T) {
	env := newTestAuth(t)
	api := startAPI(t, env)
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))
	w, err := proxy.NewWatcher(context.Background(), backend.Watch{})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, api.Shutdown(ctx))
	<-w.Done()
	_, err = proxy.Ping(context.Background())
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
}
