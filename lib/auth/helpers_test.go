package auth

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testCluster = "example.test"

// testEnv is an auth server on a memory backend, with its API on
// 127.0.0.1 and a fake clock that both TLS ends use.
type testEnv struct {
	clock    *clockwork.FakeClock
	store    *services.Store
	auth     *Server
	api      *APIServer
	addr     string
	adminDir string
}

func testLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return l.WithField("component", "auth-test")
}

func newTestStore(t testing.TB, clock clockwork.Clock) *services.Store {
	t.Helper()
	bk, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { bk.Close() })
	return services.NewStore(bk)
}

// newTestAuth starts an auth server without the API.
func newTestAuth(t testing.TB) *testEnv {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	store := newTestStore(t, clock)
	adminDir := filepath.Join(t.TempDir(), "admin")
	srv, err := NewServer(ServerConfig{
		Store:            store,
		ClusterName:      testCluster,
		AdminIdentityDir: adminDir,
		BcryptCost:       bcrypt.MinCost,
		Deps:             observe.Deps{Clock: clock, Logger: testLogger()},
		Recordings:       recording.DirStorage{Dir: t.TempDir()},
	})
	require.NoError(t, err)
	return &testEnv{clock: clock, store: store, auth: srv, adminDir: adminDir}
}

// newTestAPI starts an auth server and serves its API on 127.0.0.1:0.
func newTestAPI(t testing.TB) *testEnv {
	t.Helper()
	env := newTestAuth(t)
	startAPI(t, env)
	return env
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// startAPI serves env's auth server on a fresh loopback listener until the
// test ends (or the caller closes it first).
func startAPI(t testing.TB, env *testEnv) *APIServer {
	t.Helper()
	l, err := netListen()
	require.NoError(t, err)
	api, err := NewAPIServer(APIConfig{Auth: env.auth, Listener: l, Deps: observe.Deps{Logger: testLogger()}})
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- api.Serve() }()
	t.Cleanup(func() {
		api.Close()
		require.NoError(t, <-served)
	})
	env.api = api
	env.addr = l.Addr().String()
	return api
}

// client returns an API client for id, closed at the end of the test.
func (e *testEnv) client(t testing.TB, id *Identity) *Client {
	t.Helper()
	c, err := NewClient(ClientConfig{Addr: e.addr, Identity: id, Deps: observe.Deps{Clock: e.clock}, Timeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// identity issues an identity in-process.
func (e *testEnv) identity(t testing.TB, id, role string) *Identity {
	t.Helper()
	ident, err := e.auth.IssueIdentity(context.Background(), IdentityRequest{ID: id, Role: role, Hostname: id + "-host"})
	require.NoError(t, err)
	return ident
}

func (e *testEnv) adminClient(t *testing.T) *Client {
	t.Helper()
	id, err := ReadIdentity(e.adminDir)
	require.NoError(t, err)
	return e.client(t, id)
}

// requireKind asserts err has the trace kind checked by is, and that the
// message mentions want.
func requireKind(t *testing.T, err error, is func(error) bool, want string) {
	t.Helper()
	require.Error(t, err)
	require.True(t, is(err), "unexpected error kind: %T %v", errors.Unwrap(err), err)
	require.Contains(t, err.Error(), want)
}

// hostKeyServer is a real x/crypto SSH server on 127.0.0.1:0 presenting
// one host key (a node's certificate, or anything a test wants to pass
// off as one). It completes key exchange and then refuses every
// authentication, which is all an address check ever gets to see.
type hostKeyServer struct {
	addr string
	// conns counts accepted connections: how often auth dialed.
	conns atomic.Int64
	l     net.Listener
	wg    sync.WaitGroup
}

func serveHostKey(t *testing.T, signer ssh.Signer) *hostKeyServer {
	t.Helper()
	return serveHostKeyOn(t, signer, "127.0.0.1:0")
}

// serveHostKeyOn is serveHostKey on another loopback address.
func serveHostKeyOn(t *testing.T, signer ssh.Signer, listenAddr string) *hostKeyServer {
	t.Helper()
	l, err := net.Listen("tcp", listenAddr)
	require.NoError(t, err)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(ssh.ConnMetadata, ssh.PublicKey) (*ssh.Permissions, error) {
		return nil, errors.New("no")
	}}
	cfg.AddHostKey(signer)
	s := &hostKeyServer{addr: l.Addr().String(), l: l}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if sc, _, _, err := ssh.NewServerConn(c, cfg); err == nil {
					sc.Close()
				}
			}()
		}
	}()
	t.Cleanup(s.close)
	return s
}

// close stops the server and waits for its goroutines; idempotent.
func (s *hostKeyServer) close() {
	s.l.Close()
	s.wg.Wait()
}

// hostNode is a host identity with an SSH server answering with its
// certificate: what a real node looks like to auth's address check.
type hostNode struct {
	id   *Identity
	addr string
	srv  *hostKeyServer
}

// newHostNode issues an identity for uuid and serves its host key.
func (e *testEnv) newHostNode(t *testing.T, uuid, role string) hostNode {
	t.Helper()
	id := e.identity(t, uuid, role)
	srv := serveHostKey(t, id.SSHSigner)
	return hostNode{id: id, addr: srv.addr, srv: srv}
}
