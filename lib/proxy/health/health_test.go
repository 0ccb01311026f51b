package health

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

const testCluster = "example"

var t0 = time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)

func openSSHNode(uuid, hostname, addr string) services.Node {
	return services.Node{UUID: uuid, Hostname: hostname, Addr: addr, Cluster: testCluster, Kind: services.NodeKindOpenSSH}
}

func TestCheck(t *testing.T) {
	ca, other := srvtest.NewCA(t), srvtest.NewCA(t)
	cas := []ssh.PublicKey{ca.Signer.PublicKey()}
	good := startSSHServer(t, ca.HostSigner(t, "uuid-1", "db1", "db1."+testCluster))
	wrongCA := startSSHServer(t, other.HostSigner(t, "uuid-1", "db1"))
	wrongName := startSSHServer(t, ca.HostSigner(t, "uuid-1", "web1"))
	plain := startSSHServer(t, srvtest.NewSigner(t))

	// A TCP server that is not an SSH server: it talks HTTP.
	notSSH, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { notSSH.Close() })
	go func() {
		for {
			c, err := notSSH.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()

	for _, tc := range []struct {
		name, addr string
		ok         func(error) bool
		msg        string
	}{
		{"valid host certificate", good.addr, nil, ""},
		{"signed by another CA", wrongCA.addr, trace.IsAccessDenied, "not signed by a trusted host CA"},
		{"naming another host", wrongName.addr, trace.IsAccessDenied, `principal "db1" not in the set`},
		{"plain host key", plain.addr, trace.IsAccessDenied, "offers no host certificate"},
		{"nothing listening", freeport.RefusedAddr(t), trace.IsConnectionProblem, "connection refused"},
		{"not an SSH server", notSSH.Addr().String(), trace.IsConnectionProblem, "SSH handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(context.Background(), CheckRequest{Node: openSSHNode("uuid-1", "db1", tc.addr), HostCAs: cas, Timeout: 5 * time.Second})
			if tc.ok == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.True(t, tc.ok(err), "%T: %v", err, err)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

// TestCheckTimeout: a server that accepts but never speaks is offline
// within the timeout.
func TestCheckTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	start := time.Now()
	err = Check(context.Background(), CheckRequest{Node: openSSHNode("u", "db1", ln.Addr().String()), HostCAs: []ssh.PublicKey{srvtest.NewCA(t).Signer.PublicKey()}, Timeout: 200 * time.Millisecond})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.ErrorContains(t, err, "no SSH answer within 200ms")
	require.Less(t, time.Since(start), 5*time.Second)
}

// inventory is a real NodeWatcher over a memory backend.
func inventory(t *testing.T, clock clockwork.Clock, nodes ...services.Node) (*services.Store, *services.NodeWatcher) {
	t.Helper()
	b, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	s := services.NewStore(b)
	for _, n := range nodes {
		require.NoError(t, s.UpsertNode(context.Background(), n))
	}
	w, err := services.NewNodeWatcher(services.NodeWatcherConfig{Events: s.NodeEvents(), Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	require.NoError(t, w.WaitSynced(context.Background()))
	return s, w
}

// countingDialer records when (on the fake clock) each check dialed.
type countingDialer struct {
	clock clockwork.Clock
	dials chan time.Time
}

func (d *countingDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.dials <- d.clock.Now()
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// step advances the clock by d and waits for the check that must end at
// the new time, returning the node's status then.
func step(t *testing.T, c *Checker, clock *clockwork.FakeClock, dialer *countingDialer, d time.Duration, uuid string) Status {
	t.Helper()
	updated := c.Updated()
	clock.Advance(d)
	select {
	case at := <-dialer.dials:
		require.Equal(t, clock.Now(), at, "checked at the wrong time")
	case <-time.After(10 * time.Second):
		t.Fatalf("no check %v after the last one", d)
	}
	select {
	case <-updated:
	case <-time.After(10 * time.Second):
		t.Fatal("check did not end")
	}
	st, ok := c.Status(uuid)
	require.True(t, ok)
	return st
}

// TestCheckerOfflineAndBack drives one node through online, offline with
// its backoff, and online again, on a fake clock against a real x/crypto
// server.
func TestCheckerOfflineAndBack(t *testing.T) {
	clock := clockwork.NewFakeClockAt(t0)
	ca := srvtest.NewCA(t)
	srv := startSSHServer(t, ca.HostSigner(t, "uuid-db1", "db1"))
	postern := services.Node{UUID: "uuid-web", Hostname: "web", Addr: "127.0.0.1:1", Cluster: testCluster, Expires: t0.Add(time.Hour)}
	_, w := inventory(t, clock, openSSHNode("uuid-db1", "db1", srv.addr), postern)
	ap := srvtest.NewAccessPoint()
	ap.SetCA(ca.CertAuthority(testCluster, services.HostCA))
	dialer := &countingDialer{clock: clock, dials: make(chan time.Time, 16)}

	c, err := New(Config{ClusterName: testCluster, Nodes: w, CAs: ap, Deps: observe.Deps{Clock: clock}, Dialer: dialer,
		Interval: 10 * time.Second, MinBackoff: 2 * time.Second, MaxBackoff: 8 * time.Second})
	require.NoError(t, err)
	defer func() {
		require.NoError(t, c.Close())
		<-c.Done()
	}()
	require.True(t, c.Online("uuid-db1"), "not checked yet: dialed")

	// The first round checks at once; the Postern node is never checked.
	updated := c.Updated()
	require.Equal(t, t0, <-dialer.dials)
	<-updated
	st, ok := c.Status("uuid-db1")
	require.True(t, ok)
	require.Equal(t, Status{Online: true, Checked: t0}, st)
	_, ok = c.Status("uuid-web")
	require.False(t, ok)

	// Healthy: next check after Interval.
	st = step(t, c, clock, dialer, 10*time.Second, "uuid-db1")
	require.True(t, st.Online)

	// The server goes away: offline at the next check, then retried at
	// 2s, 4s, 8s, 8s.
	srv.stop()
	st = step(t, c, clock, dialer, 10*time.Second, "uuid-db1")
	require.False(t, st.Online)
	require.False(t, c.Online("uuid-db1"))
	require.Equal(t, []string{"uuid-db1"}, c.Offline(), "reported in the proxy's heartbeat")
	require.Equal(t, 1, st.Failures)
	require.Contains(t, st.Error, "connecting to "+srv.addr)
	for i, d := range []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		clock.Advance(d - time.Second)
		st = step(t, c, clock, dialer, time.Second, "uuid-db1")
		require.False(t, st.Online)
		require.Equal(t, i+2, st.Failures)
	}

	// Back: online at the next retry, and checked every Interval again.
	srv.restart(t)
	st = step(t, c, clock, dialer, 8*time.Second, "uuid-db1")
	require.Equal(t, Status{Online: true, Checked: clock.Now()}, st)
	require.True(t, c.Online("uuid-db1"))
	require.Empty(t, c.Offline())
	st = step(t, c, clock, dialer, 10*time.Second, "uuid-db1")
	require.True(t, st.Online)
	require.Empty(t, dialer.dials, "a check out of schedule")
}

func TestConfig(t *testing.T) {
	_, err := New(Config{Nodes: nil})
	require.ErrorContains(t, err, "missing ClusterName")
	_, err = New(Config{ClusterName: "c"})
	require.ErrorContains(t, err, "missing Nodes")
	_, err = New(Config{ClusterName: "c", Nodes: &services.NodeWatcher{}})
	require.ErrorContains(t, err, "missing CAs")
	_, err = New(Config{ClusterName: "c", Nodes: &services.NodeWatcher{}, CAs: srvtest.NewAccessPoint(), MinBackoff: time.Minute, MaxBackoff: time.Second})
	require.ErrorContains(t, err, "MaxBackoff 1s is below MinBackoff 1m0s")
}
