package integration

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/proxy/peer"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// opensshConfigVia is c's OpenSSH config with host jumping through the
// proxy SSH port at proxyAddr (any proxy of the cluster).
func (c *allInOne) opensshConfigVia(t *testing.T, proxyAddr net.Addr, host string) string {
	t.Helper()
	cfg := fmt.Sprintf(`Host proxy
  HostName 127.0.0.1
  Port %d
Host %s
  ProxyJump proxy
Host *
  User %s
  IdentityFile %s
  CertificateFile %s-cert.pub
  IdentitiesOnly yes
  UserKnownHostsFile %s.known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
`, proxyAddr.(*net.TCPAddr).Port, host, c.login, c.keyPath, c.keyPath, c.keyPath)
	path := filepath.Join(t.TempDir(), "ssh_config")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}

// waitLease waits until auth holds a tunnel lease for node from proxy.
func waitLease(t testing.TB, clt *auth.Client, node, proxy string) services.TunnelConnection {
	t.Helper()
	var found services.TunnelConnection
	require.Eventually(t, func() bool {
		tcs, err := clt.GetTunnelConnections(context.Background())
		if err != nil {
			return false
		}
		for _, tc := range tcs {
			if tc.NodeUUID == node && tc.ProxyUUID == proxy {
				found = tc
				return true
			}
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "no lease for node %s from proxy %s", node, proxy)
	return found
}

// TestPeeredTunnel: a node whose only tunnel is on proxy A (the
// all-in-one it joined through) is reached through proxy B by OpenSSH's
// ssh -J, half-close and a bulk copy included, because A's lease tells B
// where the tunnel is and B dials it through A's peer port. `pctl route`
// says which proxy it goes via. A node identity on B's peer port is
// refused and audited.
func TestPeeredTunnel(t *testing.T) {
	requireOpenSSH(t, "ssh")
	c := newAllInOne(t)
	pb, _ := startRemoteProxy(t, c.dataDir, c.p, "edge-b")
	n, ndir := startNATNode(t, c, "natted")
	clt := adminClient(t, c.dataDir, c.p)
	waitNodes(t, clt, 2)

	lease := waitLease(t, clt, n.HostUUID(), c.p.HostUUID())
	require.Equal(t, c.p.Addr(service.ListenerPeer).String(), lease.PeerAddr)
	// The precondition: B holds no tunnel from the node, so B can only
	// reach it through A.
	tcs, err := clt.GetTunnelConnections(context.Background())
	require.NoError(t, err)
	for _, tc := range tcs {
		require.NotEqual(t, pb.HostUUID(), tc.ProxyUUID, "the node must have no tunnel on proxy B for this test")
	}

	cfg := c.opensshConfigVia(t, pb.Addr(service.ListenerProxySSH), "natted")
	t.Run("ssh -J through B", func(t *testing.T) {
		out, err := exec.Command("ssh", "-F", cfg, "natted", "echo peered; echo $SSH_POSTERN_USER").CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "peered\nalice\n", string(out))
	})
	t.Run("half-close through B", func(t *testing.T) {
		cmd := exec.Command("ssh", "-F", cfg, "natted", "cat; echo done")
		cmd.Stdin = strings.NewReader("abc")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "abcdone\n", string(out))
	})
	t.Run("bulk through B", func(t *testing.T) {
		cmd := exec.Command("ssh", "-F", cfg, "natted", "head -c 8388608 /dev/zero")
		out, err := cmd.Output()
		require.NoError(t, err)
		require.Len(t, out, 8<<20)
	})
	t.Run("pctl route says via peer", func(t *testing.T) {
		out := mustPctl(t, c.dataDir, "", "route", "natted")
		require.Contains(t, out, "via peer "+c.p.HostUUID())
	})

	t.Run("a node identity on the peer port is refused and audited", func(t *testing.T) {
		ncfg := &config.Config{FileConfig: config.FileConfig{DataDir: ndir}}
		nid, err := auth.ReadIdentity(ncfg.IdentityDir(auth.RoleNode))
		require.NoError(t, err)
		pc, err := peer.NewClient(peer.ClientConfig{
			Identity: peer.Identity{UUID: nid.ID, ClusterName: clusterName, Certificate: nid.TLSCert,
				CAPool: func() *x509.CertPool { return nid.TLSCAPool }},
			Locator: staticLeases{{NodeUUID: n.HostUUID(), ProxyUUID: pb.HostUUID(), PeerAddr: pb.Addr(service.ListenerPeer).String(), Expires: time.Now().Add(time.Hour)}},
		})
		require.NoError(t, err)
		defer pc.Close()
		_, err = pc.DialPeer(context.Background(), pb.HostUUID(), n.HostUUID(), "", "")
		require.Error(t, err)
		require.Eventually(t, func() bool {
			found, err := clt.SearchEvents(context.Background(), time.Now().Add(-time.Hour), events.AccessDenied, 100)
			if err != nil {
				return false
			}
			for _, e := range found {
				r, _ := e.Fields[events.FieldReason].(string)
				if e.Fields[events.FieldKind] == "peer" && strings.Contains(r, `only "proxy" may peer`) {
					return true
				}
			}
			return false
		}, 20*time.Second, 100*time.Millisecond, "the refusal is in the audit log")
	})
}

// staticLeases is a fixed peer.Locator.
type staticLeases []services.TunnelConnection

func (l staticLeases) Holders(node, exclude string) []services.TunnelConnection {
	var out []services.TunnelConnection
	for _, tc := range l {
		if tc.NodeUUID == node && tc.ProxyUUID != exclude {
			out = append(out, tc)
		}
	}
	return out
}

func (staticLeases) Located(string) <-chan struct{} { return nil }

// leaseHolders lists the proxies auth holds a live lease from for node.
func leaseHolders(t testing.TB, clt *auth.Client, node string) []string {
	t.Helper()
	tcs, err := clt.GetTunnelConnections(context.Background())
	require.NoError(t, err)
	var out []string
	for _, tc := range tcs {
		if tc.NodeUUID == node {
			out = append(out, tc.ProxyUUID)
		}
	}
	return out
}

// TestPeerHolderKilled: kill -9 of the proxy holding a node's only tunnel.
// Its lease lapses by itself within the TTL (it deleted nothing), so the
// other proxy stops offering it; a session through the other proxy during
// the outage fails with the offline error instead of hanging on the dead
// peer; once the node's tunnel is back (the agent re-homes to the proxy
// it knows, restarted at the same addresses), new sessions through the
// other proxy work again within 10s of the restart.
func TestPeerHolderKilled(t *testing.T) {
	c := newAllInOne(t)
	d := startProxyDaemon(t, c.dataDir, c.p, "edge-a")
	n := startNATNodeVia(t, c.dataDir, d.webAddr, "natted")
	clt := adminClient(t, c.dataDir, c.p)
	cfg := c.clientConfig(t)
	via := c.p.Addr(service.ListenerProxySSH).String()
	var holder string
	require.Eventually(t, func() bool {
		h := leaseHolders(t, clt, n.HostUUID())
		if len(h) == 1 && h[0] != c.p.HostUUID() {
			holder = h[0]
			return true
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "the node's tunnel is on the daemon only")
	sc, err := jumpVia(t, cfg, via, "natted:0")
	require.NoError(t, err)
	out, err := run(t, sc, "echo before")
	require.NoError(t, err)
	require.Equal(t, "before\n", out)

	d.kill9(t)
	killed := time.Now()
	require.Eventually(t, func() bool { return len(leaseHolders(t, clt, n.HostUUID())) == 0 },
		services.DefaultTunnelConnectionTTL+3*time.Second, 100*time.Millisecond, "the dead proxy's lease lapses at its TTL")
	t.Logf("lease gone %v after kill -9", time.Since(killed))

	t.Run("during the outage: offline, not a hang", func(t *testing.T) {
		proxy, err := ssh.Dial("tcp", via, cfg)
		require.NoError(t, err)
		defer proxy.Close()
		start := time.Now()
		_, err = proxy.Dial("tcp", "natted:0")
		require.Error(t, err)
		require.Contains(t, unquote(err.Error()), `node "natted" is offline`)
		require.Less(t, time.Since(start), 10*time.Second)
	})

	d.start(t)
	restarted := time.Now()
	require.Eventually(t, func() bool {
		sc, err := jumpVia(t, cfg, via, "natted:0")
		if err != nil {
			return false
		}
		out, err := run(t, sc, "echo after")
		return err == nil && out == "after\n"
	}, 10*time.Second, 200*time.Millisecond, "new sessions through the other proxy within 10s of the restart")
	t.Logf("a session through the peer %v after the restart", time.Since(restarted))
	require.Equal(t, []string{holder}, leaseHolders(t, clt, n.HostUUID()))
}
