package etcdbk

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
)

// TestTLS talks to an etcd that only accepts mutual TLS: the configured CA
// and client certificate work; a wrong CA, no client certificate, or a
// certificate from another CA are refused at New with an error naming
// the endpoint.
func TestTLS(t *testing.T) {
	srv := etcdtest.StartTLS(t)
	f := srv.TLS
	ctx := context.Background()

	good, err := LoadTLS(f.CAFile, f.CertFile, f.KeyFile)
	require.NoError(t, err)
	b, err := New(ctx, Config{Endpoints: srv.Endpoints, Prefix: "/tls", TLS: good})
	require.NoError(t, err)
	defer b.Close()
	_, err = b.Put(ctx, backend.Item{Key: "/k", Value: []byte("v")})
	require.NoError(t, err)
	got, err := b.Get(ctx, "/k")
	require.NoError(t, err)
	require.Equal(t, []byte("v"), got.Value)

	caOnly, err := LoadTLS(f.CAFile, "", "")
	require.NoError(t, err)
	wrongCA, err := LoadTLS(f.OtherCAFile, f.CertFile, f.KeyFile)
	require.NoError(t, err)
	foreign, err := LoadTLS(f.CAFile, f.OtherCertFile, f.OtherKeyFile)
	require.NoError(t, err)
	// Each failure says why, not just "context deadline exceeded".
	for name, tc := range map[string]struct {
		cfg  *tls.Config
		want string
	}{
		"no client certificate":          {caOnly, "TLS: remote error: tls: certificate required"},
		"server not signed by ca_file":   {wrongCA, "TLS: tls: failed to verify certificate"},
		"client certificate of other CA": {foreign, "TLS: remote error: tls:"},
		"plain TCP to a TLS etcd":        {nil, "no answer from"},
	} {
		t.Run(name, func(t *testing.T) {
			eps := srv.Endpoints
			if tc.cfg == nil {
				eps = []string{"http" + srv.Endpoints[0][len("https"):]}
			}
			_, err := New(ctx, Config{Endpoints: eps, TLS: tc.cfg, DialTimeout: time.Second})
			require.True(t, trace.IsConnectionProblem(err), "%v", err)
			require.Contains(t, err.Error(), eps[0])
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestLoadTLSErrors: each bad etcd_tls setting is named.
func TestLoadTLSErrors(t *testing.T) {
	f := etcdtest.WriteTLSFiles(t)
	for _, tc := range []struct {
		ca, cert, key, want string
	}{
		{"", f.CertFile, f.KeyFile, "missing ca_file"},
		{f.CAFile, f.CertFile, "", "cert_file and key_file go together"},
		{"/nonexistent/ca.pem", "", "", "/nonexistent/ca.pem"},
		{f.KeyFile, "", "", "holds no PEM certificate"},
		{f.CAFile, f.CertFile, f.OtherKeyFile, "key_file"},
	} {
		_, err := LoadTLS(tc.ca, tc.cert, tc.key)
		require.True(t, trace.IsBadParameter(err), "%v", err)
		require.Contains(t, err.Error(), tc.want)
	}
}

// TestThreeMembers runs the backend on a three-member etcd: with one
// member down, reads, writes and watches go on; with two down, calls fail
// within the request timeout with a ConnectionProblem that names the
// endpoints; once the members are back the same Backend recovers by
// itself, and a new watcher (what a broken watcher's owner starts when it
// re-syncs) sees new writes.
func TestThreeMembers(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	ctx := context.Background()
	b, err := New(ctx, Config{Endpoints: c.Endpoints, Prefix: "/ha", RequestTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer b.Close()
	_, err = b.Put(ctx, backend.Item{Key: "/before", Value: []byte("1")})
	require.NoError(t, err)

	// The client may be pinned to member 0: stopping it also checks that
	// the client moves to another endpoint.
	c.Members[0].Stop()
	require.Eventually(t, func() bool {
		_, err := b.Put(ctx, backend.Item{Key: "/one-down", Value: []byte("2")})
		return err == nil
	}, 20*time.Second, 100*time.Millisecond, "writes go on with one member down")
	got, err := b.Get(ctx, "/before")
	require.NoError(t, err)
	require.Equal(t, []byte("1"), got.Value)
	_, err = b.Create(ctx, backend.Item{Key: "/created", Value: []byte("3")})
	require.NoError(t, err)
	w, err := b.NewWatcher(ctx, backend.Watch{Name: "one-down", Prefixes: []string{"/w/"}})
	require.NoError(t, err)
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)
	_, err = b.Put(ctx, backend.Item{Key: "/w/1", Value: []byte("x")})
	require.NoError(t, err)
	ev := <-w.Events()
	require.Equal(t, "/w/1", ev.Item.Key)

	c.Members[1].Stop()
	start := time.Now()
	_, err = b.Put(ctx, backend.Item{Key: "/no-quorum", Value: []byte("4")})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.Contains(t, err.Error(), c.Endpoints[2])
	require.Less(t, time.Since(start), 10*time.Second, "a call without quorum fails in bounded time")
	_, err = b.Get(ctx, "/before")
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	t.Logf("without quorum: %v", err)
	// The watcher required a leader: it is closed with a reason instead of
	// silently delivering nothing.
	select {
	case <-w.Done():
		require.Error(t, w.Error())
	case <-time.After(20 * time.Second):
		t.Fatal("a watcher without a leader must close")
	}

	c.Members[0].Restart(t)
	c.Members[1].Restart(t)
	require.Eventually(t, func() bool {
		_, err := b.Put(ctx, backend.Item{Key: "/after", Value: []byte("5")})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the backend recovers when the quorum is back")
	w2, err := b.NewWatcher(ctx, backend.Watch{Name: "resync", Prefixes: []string{"/w/"}})
	require.NoError(t, err)
	defer w2.Close()
	require.Equal(t, backend.OpInit, (<-w2.Events()).Type)
	_, err = b.Put(ctx, backend.Item{Key: "/w/2", Value: []byte("y")})
	require.NoError(t, err)
	require.Equal(t, "/w/2", (<-w2.Events()).Item.Key)
	items, err := b.GetRange(ctx, "/", 0)
	require.NoError(t, err)
	keys := make([]string, 0, len(items))
	for _, it := range items {
		keys = append(keys, it.Key)
	}
	// The write that timed out without a quorum may or may not have been
	// applied (the surviving member kept the proposal): a timeout is not a
	// "no". Everything acknowledged is there.
	require.Subset(t, keys, []string{"/after", "/before", "/created", "/one-down", "/w/1", "/w/2"})
}
