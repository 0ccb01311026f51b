package etcdbk

import (
	"context"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/backend/test"
)

// TestMain checks for leaks, except for what embedded etcd members leave
// behind after Close: their peer transports keep idle keep-alive
// connections to one another in an http.Transport pool that Close does not
// drain, so both ends of those connections (the client's read and write
// loops, and the peer server's connection reader on its cmux) outlive the
// members. They belong to etcd, not to the backend, and only appear with
// several members (TestThreeMembers).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("github.com/soheilhy/cmux.(*MuxConn).Read"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
	)
}

func newBackend(t testing.TB, srv *etcdtest.Server, prefix string) *Backend {
	b, err := New(context.Background(), Config{Endpoints: srv.Endpoints, Prefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// TestEtcd runs the suite on one embedded etcd; each subtest gets its own
// namespace, which also exercises Prefix isolation.
func TestEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	test.RunBackendComplianceSuite(t, func(t *testing.T) (backend.Backend, *clockwork.FakeClock) {
		return newBackend(t, srv, "/postern-test/"+t.Name()), nil
	})
}

// TestNamespaces checks that two prefixes on one etcd do not see each
// other's keys or events.
func TestNamespaces(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	a := newBackend(t, srv, "/a")
	b := newBackend(t, srv, "/ab")
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "ns"})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)

	_, err = a.Put(ctx, backend.Item{Key: "/k", Value: []byte("a")})
	require.NoError(t, err)
	_, err = b.Get(ctx, "/k")
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = b.Put(ctx, backend.Item{Key: "/k", Value: []byte("b")})
	require.NoError(t, err)
	ev := <-w.Events()
	require.Equal(t, backend.OpPut, ev.Type)
	require.Equal(t, "/k", ev.Item.Key)
	require.Equal(t, []byte("b"), ev.Item.Value)
	got, err := a.Get(ctx, "/k")
	require.NoError(t, err)
	require.Equal(t, []byte("a"), got.Value)

	// A raw value that is not an envelope is reported, not misread.
	_, err = a.Client().Put(ctx, "/a/raw", "plain")
	require.NoError(t, err)
	_, err = a.Get(ctx, "/raw")
	require.True(t, trace.IsBadParameter(err), "%v", err)
}

func TestUnreachable(t *testing.T) {
	_, err := New(context.Background(), Config{
		Endpoints:   []string{"http://127.0.0.1:1"},
		DialTimeout: 300 * time.Millisecond,
	})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.Contains(t, err.Error(), "127.0.0.1:1")
	require.Contains(t, err.Error(), "connection refused")

	_, err = New(context.Background(), Config{})
	require.True(t, trace.IsBadParameter(err), "%v", err)
}

func BenchmarkEtcd(b *testing.B) {
	srv := etcdtest.Start(b)
	test.RunBackendBenchmarks(b, func(b *testing.B) backend.Backend {
		return newBackend(b, srv, "/bench/"+b.Name())
	})
}

// TestLeases checks that items expiring in the same second share a lease,
// and that a cached lease etcd has lost is replaced transparently.
func TestLeases(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	b := newBackend(t, srv, "/leases")
	expires := b.Clock().Now().Add(time.Hour).Truncate(time.Second)
	leaseOf := func(key string) int64 {
		resp, err := b.Client().Get(ctx, "/leases"+key)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		return resp.Kvs[0].Lease
	}
	_, err := b.Put(ctx, backend.Item{Key: "/n1", Value: []byte("1"), Expires: expires})
	require.NoError(t, err)
	_, err = b.Create(ctx, backend.Item{Key: "/n2", Value: []byte("2"), Expires: expires.Add(-time.Millisecond)})
	require.NoError(t, err)
	_, err = b.Put(ctx, backend.Item{Key: "/n3", Value: []byte("3"), Expires: expires.Add(time.Second)})
	require.NoError(t, err)
	_, err = b.Put(ctx, backend.Item{Key: "/forever", Value: []byte("4")})
	require.NoError(t, err)
	l1 := leaseOf("/n1")
	require.NotZero(t, l1)
	require.Equal(t, l1, leaseOf("/n2"))
	require.NotEqual(t, l1, leaseOf("/n3"))
	require.Zero(t, leaseOf("/forever"))

	// Revoking the lease deletes its keys; the next write for that second
	// must get a fresh lease instead of failing.
	_, err = b.Client().Revoke(ctx, clientv3.LeaseID(l1))
	require.NoError(t, err)
	_, err = b.Get(ctx, "/n1")
	require.True(t, trace.IsNotFound(err), "%v", err)
	_, err = b.Put(ctx, backend.Item{Key: "/n1", Value: []byte("again"), Expires: expires})
	require.NoError(t, err)
	require.NotEqual(t, l1, leaseOf("/n1"))
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte(encode(backend.Item{Key: "/k", Value: []byte("v")})))
	f.Add([]byte(encode(backend.Item{Key: "/k", Value: []byte("v"), Expires: time.Unix(1700000000, 5)})))
	f.Fuzz(func(t *testing.T, data []byte) {
		it, err := decode("/k", data)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to the same bytes.
		require.Equal(t, string(data), encode(it))
	})
}
