package health

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// TestRealSSHD: the check against Debian's sshd, and the Router with the
// Checker: an OpenSSH node is dialed while its sshd answers, is offline
// (the documented error) once the sshd is killed, and is back when the
// sshd is.
func TestRealSSHD(t *testing.T) {
	ca := srvtest.NewCA(t)
	d := srvtest.StartSSHD(t, srvtest.SSHDConfig{HostCA: ca, HostPrincipals: []string{"db1", "db1." + testCluster, "127.0.0.1"}})

	// The check itself: the right CA and name pass; another name, or
	// another CA, do not.
	cas := []ssh.PublicKey{ca.Signer.PublicKey()}
	require.NoError(t, Check(context.Background(), CheckRequest{Node: openSSHNode("u", "db1", d.Addr), HostCAs: cas}))
	err := Check(context.Background(), CheckRequest{Node: openSSHNode("u", "web1", d.Addr), HostCAs: cas})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	err = Check(context.Background(), CheckRequest{Node: openSSHNode("u", "db1", d.Addr), HostCAs: []ssh.PublicKey{srvtest.NewCA(t).Signer.PublicKey()}})
	require.ErrorContains(t, err, "not signed by a trusted host CA")

	clock := clockwork.NewFakeClockAt(t0)
	store, w := inventory(t, clock, openSSHNode("uuid-db1", "db1", d.Addr))
	require.NoError(t, store.SetClusterNetworkingConfig(context.Background(), services.DefaultClusterNetworkingConfig()))
	ap := srvtest.NewAccessPoint()
	ap.SetCA(ca.CertAuthority(testCluster, services.HostCA))
	dialer := &countingDialer{clock: clock, dials: make(chan time.Time, 16)}
	c, err := New(Config{ClusterName: testCluster, Nodes: w, CAs: ap, Deps: observe.Deps{Clock: clock}, Dialer: dialer,
		Interval: 10 * time.Second, MinBackoff: 2 * time.Second, MaxBackoff: 8 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	router, err := proxy.NewRouter(proxy.RouterConfig{ClusterName: testCluster, NodeWatcher: w, Networking: store, Health: c,
		Deps: observe.Deps{Clock: clock, Metrics: prometheus.NewRegistry()},
	})
	require.NoError(t, err)
	dial := func() error {
		conn, _, err := router.DialHost(context.Background(), proxy.RouteRequest{Target: proxy.Target{Host: "db1", Port: "22"}})
		if err != nil {
			return err
		}
		defer conn.Close()
		// What the client's ssh reads first: sshd's identification.
		b := make([]byte, len("SSH-2.0-OpenSSH"))
		_, err = io.ReadFull(conn, b)
		require.NoError(t, err)
		require.Equal(t, "SSH-2.0-OpenSSH", string(b))
		return nil
	}

	updated := c.Updated()
	<-dialer.dials
	<-updated
	st, ok := c.Status("uuid-db1")
	require.True(t, ok)
	require.True(t, st.Online, st.Error)
	require.NoError(t, dial())

	d.Stop()
	st = step(t, c, clock, dialer, 10*time.Second, "uuid-db1")
	require.False(t, st.Online)
	require.Contains(t, st.Error, "connection refused")
	err = dial()
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.EqualError(t, err, `node "db1" is offline: its SSH server does not answer`)

	d.Start(t)
	st = step(t, c, clock, dialer, 2*time.Second, "uuid-db1")
	require.True(t, st.Online, st.Error)
	require.NoError(t, dial())
}
