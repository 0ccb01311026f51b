package integration

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"

	"github.com/stretchr/testify/require"

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

// TestPeeredTunnel: a node in a network namespace whose only tunnel is on
// proxy A (the all-in-one it joined through, whose ports face the
// namespace) is reached through proxy B, whose tunnel port the namespace
// cannot reach, by OpenSSH's ssh -J, half-close and a bulk copy
// included: A's lease tells B where the tunnel is and B dials it through
// A's peer port. `pctl route` says which proxy it goes via. A node
// identity on B's peer port is refused and audited.
func TestPeeredTunnel(t *testing.T) {
	requireOpenSSH(t, "ssh")
	ns := newNetNS(t)
	c := newNATCluster(t, ns)
	clt := adminClient(t, c.dataDir, c.p)
	pb, _ := startRemoteProxy(t, c.dataDir, c.p, "edge-b")
	waitProxies(t, clt, 2)
	nn, rec := startNSNode(t, ns, c, clt, "natted")
	ndir := nn.dataDir

	lease := waitLease(t, clt, rec.UUID, c.p.HostUUID())
	require.Equal(t, c.p.Addr(service.ListenerPeer).String(), lease.PeerAddr)
	// The precondition, checked again at the end: B holds no tunnel from
	// the node (its tunnel port is on loopback, which the namespace does
	// not reach), so B can only reach the node through A.
	requireNoLeaseFrom := func() {
		require.NotContains(t, leaseHolders(t, clt, rec.UUID), pb.HostUUID(), "the node must have no tunnel on proxy B")
	}
	requireNoLeaseFrom()
	defer requireNoLeaseFrom()
	n := struct{ uuid string }{rec.UUID}

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
			Locator: staticLeases{{NodeUUID: n.uuid, ProxyUUID: pb.HostUUID(), PeerAddr: pb.Addr(service.ListenerPeer).String(), Expires: time.Now().Add(time.Hour)}},
		})
		require.NoError(t, err)
		defer pc.Close()
		_, err = pc.DialPeer(context.Background(), pb.HostUUID(), n.uuid, "", "")
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
	sort.Strings(out)
	return out
}

// startNSProxyDaemon is a proxy-only `postern start` process whose web
// and tunnel ports listen on host (the namespace's side of the veth, with
// host among its public names) and its other ports on loopback, at fixed
// ports so that it can be killed and started again.
func startNSProxyDaemon(t *testing.T, authDir string, a *service.Process, name, host string) *proxyDaemon {
	t.Helper()
	return startNSProxyDaemonVia(t, authDir, a.Addr(service.ListenerAuth).String(), name, host)
}

// startNSProxyDaemonVia is startNSProxyDaemon joined to the auth servers
// in authServers (comma-separated, failover).
func startNSProxyDaemonVia(t *testing.T, authDir, authServers, name, host string) *proxyDaemon {
	t.Helper()
	m := joinRe.FindStringSubmatch(mustPctl(t, authDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	d := &proxyDaemon{dataDir: t.TempDir()}
	lport := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	hport := func() string { return net.JoinHostPort(host, strconv.Itoa(freePort(t))) }
	d.sshAddr, d.webAddr, d.tunAddr, d.diagAddr = lport(), hport(), hport(), lport()
	cfgFile := filepath.Join(t.TempDir(), "postern.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte("public_addrs: ["+host+"]\n"), 0o600))
	d.args = []string{"start", "--config", cfgFile, "--roles", "proxy", "--data-dir", d.dataDir, "--nodename", name,
		"--auth-server", authServers,
		"--ssh-addr", d.sshAddr, "--web-addr", d.webAddr, "--tunnel-addr", d.tunAddr, "--diag-addr", d.diagAddr, "--peer-addr", lport()}
	d.start(t, "--token", m[1], "--ca-pin", m[2])
	return d
}

// startNSNodeVia starts a node in ns joined through the proxy web address
// webAddr, and waits for its record.
func startNSNodeVia(t *testing.T, ns *netNS, authDir, webAddr string, clt *auth.Client, name string) (services.Node, *nsNode) {
	t.Helper()
	token, pin := nodeToken(t, authDir)
	args := []string{"start", "--roles", "node", "--data-dir", t.TempDir(), "--nodename", name,
		"--proxy-server", webAddr, "--token", token, "--ca-pin", pin, "--diag-addr", "127.0.0.1:0"}
	n := &nsNode{stderr: &syncBuffer{}}
	n.start(t, ns, args)
	var rec services.Node
	require.Eventually(t, func() bool {
		nodes, err := clt.GetNodes(context.Background(), clusterName)
		if err != nil {
			return false
		}
		for _, x := range nodes {
			if x.Hostname == name {
				rec = x
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "node %s never heartbeat; its log:\n%s", name, n.stderr)
	return rec, n
}

// TestPeerHolderKilled: a node in a network namespace has tunnels to the
// two proxies whose ports face it, A and B (the agent pool), and none to
// C, the all-in-one on loopback; C reaches it only through a peer. kill -9
// of A: A's lease lapses by itself within the TTL (it deleted nothing),
// and new sessions through C keep working throughout, through B (the
// dead peer loses the parallel dial), and within 10s at the latest;
// when A comes back the node re-homes to it too.
func TestPeerHolderKilled(t *testing.T) {
	ns := newNetNS(t)
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	da := startNSProxyDaemon(t, c.dataDir, c.p, "edge-a", ns.hostIP)
	db := startNSProxyDaemon(t, c.dataDir, c.p, "edge-b", ns.hostIP)
	waitProxies(t, clt, 3)
	rec, _ := startNSNodeVia(t, ns, c.dataDir, da.webAddr, clt, "natted")
	cfg := c.clientConfig(t)
	via := c.p.Addr(service.ListenerProxySSH).String()
	var holders []string
	require.Eventually(t, func() bool {
		holders = leaseHolders(t, clt, rec.UUID)
		return len(holders) == 2
	}, 20*time.Second, 50*time.Millisecond, "the node's tunnels are on A and B: %v", holders)
	require.NotContains(t, holders, c.p.HostUUID(), "C's tunnel port is out of the namespace's reach")
	session := func() error {
		sc, err := jumpVia(t, cfg, via, "natted:0")
		if err != nil {
			return err
		}
		out, err := run(t, sc, "echo ok")
		if err != nil {
			return err
		}
		if out != "ok\n" {
			return trace.BadParameter("got %q", out)
		}
		return nil
	}
	require.NoError(t, session())

	da.kill9(t)
	killed := time.Now()
	// Sessions through C right after the kill: the dead peer's lease is
	// still there, it loses to B.
	var failed []string
	require.Eventually(t, func() bool {
		err := session()
		if err != nil {
			failed = append(failed, err.Error())
		}
		return err == nil
	}, 10*time.Second, 200*time.Millisecond, "new sessions through C within 10s of the kill")
	t.Logf("sessions that failed right after the kill: %q", failed)
	t.Logf("first session through C %v after kill -9", time.Since(killed))
	for range 3 {
		require.NoError(t, session())
	}
	require.Eventually(t, func() bool { h := leaseHolders(t, clt, rec.UUID); return len(h) == 1 },
		services.DefaultTunnelConnectionTTL+3*time.Second, 100*time.Millisecond, "the dead proxy's lease lapses at its TTL")
	t.Logf("A's lease gone %v after kill -9", time.Since(killed))
	_ = db

	da.start(t)
	require.Eventually(t, func() bool { return len(leaseHolders(t, clt, rec.UUID)) == 2 }, 20*time.Second, 100*time.Millisecond,
		"the node re-homes to A once it is back")
	require.NoError(t, session())
}
