package auth

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend/sqlite"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// TestBackendDownIs503: with its SQLite file unusable under it, the auth
// API answers 503 and says the backend is unavailable (not 500 "disk I/O
// error"), and the client turns that into ConnectionProblem, for pctl's
// calls and for the proxy's logins alike.
func TestBackendDownIs503(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	path := filepath.Join(t.TempDir(), "backend.db")
	bk, err := sqlite.New(ctx, sqlite.Config{Path: path, Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { bk.Close() })
	adminDir := filepath.Join(t.TempDir(), "admin")
	srv, err := NewServer(ServerConfig{
		Store: services.NewStore(bk), ClusterName: testCluster, AdminIdentityDir: adminDir,
		BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Logger: testLogger()},
	})
	require.NoError(t, err)
	env := &testEnv{clock: clock, store: services.NewStore(bk), auth: srv, adminDir: adminDir}
	startAPI(t, env)
	admin := env.adminClient(t)
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))
	_, err = admin.CreateUser(ctx, "alice", []byte("alice-pw"), []string{"alice"}, nil, false)
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)

	// Overwritten in place, the WAL index too (a warm reader would not
	// notice otherwise): every read and write now fails.
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		require.NoError(t, os.WriteFile(p, bytes.Repeat([]byte("garbage!"), 1024), 0o600))
	}

	_, err = admin.GetUsers(ctx)
	t.Logf("pctl would print: %s", trace.UserMessage(err))
	requireKind(t, err, trace.IsConnectionProblem, "the auth server's backend is unavailable: sqlite backend is unavailable")
	_, err = proxy.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{AuthRequest: authapi.AuthRequest{User: "alice", Password: "alice-pw", RemoteAddr: "192.0.2.1"}, PublicKey: pub})
	requireKind(t, err, trace.IsConnectionProblem, "the auth server's backend is unavailable")

	// On the wire: 503 with the connection_problem kind.
	id, err := ReadIdentity(adminDir)
	require.NoError(t, err)
	status, body, err := rawGet(t, env, id.ClientTLSConfig(), "/v1/users")
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, status, body)
	require.Contains(t, body, `"kind":"connection_problem"`)
}

// TestClientMaps503: a 502/503/504 without our JSON body (a load balancer
// in front of auth) is a ConnectionProblem too.
func TestClientMaps503(t *testing.T) {
	for _, code := range []int{http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout} {
		rec := &http.Response{StatusCode: code, Body: http.NoBody}
		err := authapi.ReadErrorResponse(rec)
		require.True(t, trace.IsConnectionProblem(err), "%d: %v", code, err)
		require.Contains(t, err.Error(), "the auth server is unavailable")
	}
}
