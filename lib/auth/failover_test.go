package auth

import (
	"context"
	"strings"
	"testing"

	"github.com/gravitational/trace"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/stretchr/testify/require"
)

// TestClientFailover gives the client three auth API addresses, the
// first of which nobody listens on; two API servers serve one auth server
// (what two auth processes on one etcd look like to a client). Calls go
// to a live server, and keep working when the one in use goes away; with
// none left the error names every address.
func TestClientFailover(t *testing.T) {
	env := newTestAuth(t)
	l, err := netListen()
	require.NoError(t, err)
	dead := l.Addr().String()
	l.Close()
	api1 := startAPI(t, env)
	addr1 := env.addr
	api2 := startAPI(t, env)
	addr2 := env.addr

	id, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	clt, err := NewClient(ClientConfig{Addr: strings.Join([]string{dead, addr1, addr2}, ","), Identity: id, Deps: observe.Deps{Clock: env.clock}})
	require.NoError(t, err)
	defer clt.Close()
	ctx := context.Background()
	name, err := clt.Ping(ctx)
	require.NoError(t, err)
	require.Equal(t, testCluster, name)

	// The server in use goes away (its connections with it).
	api1.Close()
	_, err = clt.GetUsers(ctx)
	require.NoError(t, err, "the client fails over to the next auth server")
	_, err = clt.Ping(ctx)
	require.NoError(t, err)

	api2.Close()
	_, err = clt.Ping(ctx)
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	for _, a := range []string{dead, addr1, addr2} {
		require.Contains(t, err.Error(), a)
	}
}
