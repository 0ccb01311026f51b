package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/web"
)

// leafKnownHosts is a known_hosts for a root user reaching leaf nodes
// through the root: the root's host CA line from `pctl auth sign` and
// the leaf's host CA (from the leaf's own `pctl auth sign` file),
// scoped to `*.LEAF` names as psh writes it.
func leafKnownHosts(t *testing.T, root, leaf *allInOne, leafName string) string {
	t.Helper()
	rootKH, err := os.ReadFile(root.keyPath + ".known_hosts")
	require.NoError(t, err)
	leafKH, err := os.ReadFile(leaf.keyPath + ".known_hosts")
	require.NoError(t, err)
	var b strings.Builder
	b.Write(rootKH)
	for _, line := range strings.Split(strings.TrimSpace(string(leafKH)), "\n") {
		f := strings.Fields(line)
		require.GreaterOrEqual(t, len(f), 4, "known_hosts line %q", line)
		require.Equal(t, "@cert-authority", f[0])
		fmt.Fprintf(&b, "@cert-authority *.%s %s %s\n", leafName, f[2], f[3])
	}
	path := filepath.Join(t.TempDir(), "known_hosts")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// leafSSHConfig is an ssh_config for stock OpenSSH: `proxy` is the root
// proxy, `*.LEAF` jumps through it; the identity is keyPath's.
func leafSSHConfig(t *testing.T, proxyAddr net.Addr, login, keyPath, knownHosts, leafName string) string {
	t.Helper()
	port := proxyAddr.(*net.TCPAddr).Port
	cfg := fmt.Sprintf(`Host proxy
  HostName 127.0.0.1
  Port %d
Host *.%s
  ProxyJump proxy
Host *
  User %s
  IdentityFile %s
  CertificateFile %s-cert.pub
  IdentitiesOnly yes
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
`, port, leafName, login, keyPath, keyPath, knownHosts)
	path := filepath.Join(t.TempDir(), "ssh_config")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}

func sshOut(t *testing.T, cfg string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("ssh", append([]string{"-F", cfg}, args...)...).CombinedOutput()
	return string(out), err
}

// jumpRefusal is what OpenSSH prints when the root proxy refuses the
// jump to host (the direct-tcpip open failure, as `ssh -J` sends it; the
// jump hop's own process prints it, so it is run directly with -W).
func jumpRefusal(t *testing.T, cfg, host string) string {
	t.Helper()
	out, err := exec.Command("ssh", "-F", cfg, "-o", "LogLevel=INFO", "-W", host+":22", "proxy").CombinedOutput()
	require.Error(t, err, string(out))
	return string(out)
}

// findEvent waits for an event of typ matching ok in dataDir's audit log.
func findEvent(t *testing.T, dataDir, typ string, ok func(events.Event) bool) events.Event {
	t.Helper()
	var found events.Event
	require.Eventually(t, func() bool {
		for _, e := range eventsLs(t, dataDir) {
			if e.Type == typ && ok(e) {
				found = e
				return true
			}
		}
		return false
	}, 10*time.Second, 100*time.Millisecond, "no %s event", typ)
	return found
}

// TestLeafRoutingThroughRoot: a root user reaches a leaf cluster's node
// through the root proxy with stock OpenSSH, host keys checked
// (StrictHostKeyChecking=yes) against the leaf's host CA scoped to
// *.leaf: `ssh -J root node-1.leaf`, the subsystem `proxy:HOST:PORT@leaf`,
// scp and -A; `nodes@leaf` shows what the leaf's RBAC lets each user see
// (a leaf role's node_labels limits a root user); `proxysites` lists the
// leaf only to users whose roles map to something there; a root user
// whose roles map to nothing is told `cluster "leaf" not found`, with the
// unmapped roles in the leaf's audit log; the root audits every route to
// the leaf. Removing trust on the leaf fails new sessions within 5s, and
// trust re-established with a new token works again.
func TestLeafRoutingThroughRoot(t *testing.T) {
	requireOpenSSH(t, "ssh", "scp", "ssh-agent", "ssh-add")
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")
	mustPctl(t, root.dataDir, "", "create", "-f", writeRole(t, "auditor"))
	mustPctl(t, root.dataDir, "", "create", "-f", writeRole(t, "dev"))
	limited := filepath.Join(t.TempDir(), "limited.yaml")
	require.NoError(t, os.WriteFile(limited, []byte("kind: role\nmetadata: {name: limited}\nspec: {logins: ['{{internal.logins}}'], node_labels: {env: [elsewhere]}}\n"), 0o600))
	mustPctl(t, leaf.dataDir, "", "create", "-f", limited)
	roleMap := "[{remote: access, local: [access]}, {remote: dev, local: [limited]}]"
	establishTrust(t, root, leaf, roleMap)
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 30*time.Second, 100*time.Millisecond)

	proxyAddr := root.p.Addr(service.ListenerProxySSH)
	kh := leafKnownHosts(t, root, leaf, "leaf")
	alice := leafSSHConfig(t, proxyAddr, root.login, root.keyPath, kh, "leaf")
	bobKey, carolKey := signedUser(t, root, "bob", "dev"), signedUser(t, root, "carol", "auditor")

	t.Run("ssh -J", func(t *testing.T) {
		out, err := sshOut(t, alice, "node-1.leaf", "echo $SSH_POSTERN_USER $SSH_POSTERN_CLUSTER_NAME")
		require.NoError(t, err, out)
		require.Equal(t, "alice leaf\n", out)
		// The local node by the same name is the root's own.
		out, err = sshOut(t, alice, "-J", "proxy", "node-1.root", "echo $SSH_POSTERN_CLUSTER_NAME")
		require.NoError(t, err, out)
		require.Equal(t, "root\n", out)
		e := findEvent(t, root.dataDir, events.RouteLeaf, func(e events.Event) bool { return e.User == "alice" })
		require.Equal(t, "leaf", e.Fields[events.FieldRemoteCluster])
		require.Equal(t, "node-1.leaf:22", e.Fields[events.FieldTarget])
		require.Equal(t, "direct-tcpip", e.Fields[events.FieldKind])
	})
	t.Run("pctl route --cluster", func(t *testing.T) {
		// Without --user: the root's part (the tunnel, the leaf's
		// record), then a clear error: only a root user's view of the
		// leaf exists.
		for _, args := range [][]string{{"route", "--cluster", "leaf", "node-1"}, {"route", "node-1.leaf"}} {
			out, errOut, err := pctl(t, root.dataDir, "", args...)
			require.Error(t, err)
			require.Contains(t, out, "cluster:    leaf\n", out)
			require.Contains(t, out, "decided in the leaf cluster by its own Router", out)
			require.Contains(t, out, "via:        the leaf's tunnel on proxy "+root.p.HostUUID(), out)
			require.Regexp(t, `leaf:       leaf is a leaf cluster of root, online \(last connected \d{4}-`, out)
			require.Contains(t, errOut, "add --user NAME")
		}
		_, errOut, err := pctl(t, root.dataDir, "", "route", "--cluster", "nowhere", "node-1")
		require.Error(t, err)
		require.Contains(t, errOut, "no route to node-1@nowhere")

		// As alice: the leaf's Router explains, with its inventory.
		leafUUID := regexp.MustCompile(`(?m)^\s+\* node-1 (\S+) addr=`)
		for _, args := range [][]string{{"route", "--cluster", "leaf", "--user", "alice", "node-1"}, {"route", "--user", "alice", "node-1.leaf:22"}} {
			out := mustPctl(t, root.dataDir, "", args...)
			require.Contains(t, out, "as user:    alice (a 1m0s certificate, asked of proxy ", out)
			require.Contains(t, out, "via:        the leaf's tunnel on this proxy", out)
			require.Contains(t, out, "in leaf cluster leaf:\n", out)
			require.Contains(t, out, "\n  cluster:    leaf\n  strategy:   unambiguous_match\n  candidates: \n", out)
			m := leafUUID.FindStringSubmatch(out)
			require.NotNil(t, m, out)
			require.NotEqual(t, root.p.HostUUID(), m[1])
			require.Contains(t, out, "\n  chosen:     "+m[1]+" (node-1, ", out)
			require.Contains(t, out, "\n  reason:     matched hostname", out)
		}
		// The local cluster as alice: the root's own node-1, among what
		// her roles reach.
		out := mustPctl(t, root.dataDir, "", "route", "--user", "alice", "node-1")
		require.Contains(t, out, "cluster:    root\nstrategy:   unambiguous_match\ncandidates: \n  * node-1 ", out)
		require.NotContains(t, out, "in leaf cluster", out)
		// bob's leaf role (node_labels env=elsewhere) hides node-1: the
		// leaf explains a miss, naming no node.
		out, errOut, err = pctl(t, root.dataDir, "", "route", "--cluster", "leaf", "--user", "bob", "node-1")
		require.Error(t, err)
		require.Contains(t, out, "in leaf cluster leaf:\n", out)
		require.Contains(t, out, "  candidates: none\n", out)
		require.Contains(t, out, `  error:      node "node-1" not found in cluster "leaf"`, out)
		require.NotRegexp(t, `addr=|chosen:`, out)
		require.Contains(t, errOut, `no route to node-1@leaf as user "bob"`)
		// carol's roles map to nothing in the leaf: an unknown cluster's
		// answer, and nothing of the leaf.
		for _, cluster := range []string{"leaf", "nowhere"} {
			out, errOut, err := pctl(t, root.dataDir, "", "route", "--cluster", cluster, "--user", "carol", "node-1")
			require.Error(t, err)
			require.Empty(t, out)
			require.Contains(t, errOut, `as user "carol": cluster "`+cluster+`" not found`)
		}
		e := findEvent(t, root.dataDir, events.AccessDenied, func(e events.Event) bool { return e.User == "carol" && e.Fields[events.FieldKind] == "route" })
		require.Equal(t, "leaf", e.Fields[events.FieldRemoteCluster])
		_, errOut, err = pctl(t, root.dataDir, "", "route", "--cluster", "leaf", "--user", "nobody", "node-1")
		require.Error(t, err)
		require.NotEmpty(t, errOut)
	})
	t.Run("host key of another cluster's CA refused", func(t *testing.T) {
		// The root's CA alone does not vouch for a leaf node.
		kh, err := os.ReadFile(root.keyPath + ".known_hosts")
		require.NoError(t, err)
		scoped := filepath.Join(t.TempDir(), "kh")
		require.NoError(t, os.WriteFile(scoped, bytes.Replace(kh, []byte("@cert-authority * "), []byte("@cert-authority 127.0.0.1,*.root "), 1), 0o600))
		rootOnly := leafSSHConfig(t, proxyAddr, root.login, root.keyPath, scoped, "leaf")
		out, err := sshOut(t, rootOnly, "node-1.leaf", "true")
		require.Error(t, err, out)
		require.Contains(t, out, "Host key verification failed")
	})
	t.Run("proxy subsystem @leaf", func(t *testing.T) {
		pc := fmt.Sprintf("ProxyCommand=ssh -F %s proxy -s proxy:node-1:%%p@leaf", alice)
		out, err := sshOut(t, alice, "-o", "ProxyJump=none", "-o", pc, "node-1.leaf", "echo subsystem")
		require.NoError(t, err, out)
		require.Equal(t, "subsystem\n", out)
		out, err = sshOut(t, alice, "proxy", "-s", "proxy:ghost:0@leaf")
		require.Error(t, err)
		require.Contains(t, out, `node "ghost" not found in cluster "leaf"`)
	})
	t.Run("scp", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "src.bin")
		data := bytes.Repeat([]byte("leaf-"), 200*1024)
		require.NoError(t, os.WriteFile(src, data, 0o600))
		remote := filepath.Join(dir, "remote.bin")
		out, err := exec.Command("scp", "-F", alice, src, "node-1.leaf:"+remote).CombinedOutput()
		require.NoError(t, err, string(out))
		got, err := os.ReadFile(remote)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got), "scp copy differs")
	})
	t.Run("agent forwarding", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "agent.sock")
		agent := exec.Command("ssh-agent", "-D", "-a", sock)
		require.NoError(t, agent.Start())
		t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
		env := append(os.Environ(), "SSH_AUTH_SOCK="+sock)
		require.Eventually(t, func() bool { _, err := os.Stat(sock); return err == nil }, 10*time.Second, 20*time.Millisecond)
		add := exec.Command("ssh-add", root.keyPath)
		add.Env = env
		out, err := add.CombinedOutput()
		require.NoError(t, err, string(out))
		cmd := exec.Command("ssh", "-F", alice, "-A", "node-1.leaf", "ssh-add -l")
		cmd.Env = env
		out, err = cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		require.Contains(t, string(out), "(ED25519-CERT)")
	})
	t.Run("nodes@leaf and proxysites", func(t *testing.T) {
		out, err := exec.Command("ssh", "-F", alice, "proxy", "-s", proxyapi.SubsystemNodes+"@leaf").Output()
		require.NoError(t, err)
		var nodes []proxyapi.NodeEntry
		require.NoError(t, json.Unmarshal(out, &nodes), string(out))
		require.Len(t, nodes, 1)
		require.Equal(t, "node-1", nodes[0].Hostname)
		require.Equal(t, "leaf", nodes[0].Cluster)

		bob := leafSSHConfig(t, proxyAddr, root.login, bobKey, kh, "leaf")
		out, err = exec.Command("ssh", "-F", bob, "proxy", "-s", proxyapi.SubsystemNodes+"@leaf").Output()
		require.NoError(t, err)
		require.JSONEq(t, "[]", string(out), "the leaf's node_labels keep node-1 from bob")
		_, err = sshOut(t, bob, "node-1.leaf", "true")
		require.Error(t, err)
		require.Contains(t, jumpRefusal(t, bob, "node-1.leaf"), `node "node-1" not found in cluster "leaf"`)

		out, err = exec.Command("ssh", "-F", alice, "proxy", "-s", proxyapi.SubsystemSites).Output()
		require.NoError(t, err)
		var sites []proxyapi.Site
		require.NoError(t, json.Unmarshal(out, &sites), string(out))
		require.Len(t, sites, 2)
		require.Equal(t, "root", sites[0].Name)
		require.Equal(t, "leaf", sites[1].Name)
		require.Equal(t, "online", sites[1].Status)
		require.False(t, sites[1].LastConnected.IsZero())
	})
	t.Run("roles mapping to nothing", func(t *testing.T) {
		carol := leafSSHConfig(t, proxyAddr, root.login, carolKey, kh, "leaf")
		_, err := sshOut(t, carol, "node-1.leaf", "true")
		require.Error(t, err)
		// Exactly what a cluster that does not exist gives (rule 0 then
		// does not apply: a plain miss).
		out := jumpRefusal(t, carol, "node-1.leaf")
		require.Contains(t, out, `node "node-1.leaf" not found in cluster "root"`)
		require.NotContains(t, out, "auditor")
		require.Contains(t, jumpRefusal(t, carol, "node-1.nowhere"), `node "node-1.nowhere" not found in cluster "root"`)
		o, err := sshOut(t, carol, "proxy", "-s", "proxy:node-1:0@nowhere")
		require.Error(t, err)
		require.Contains(t, o, `cluster "nowhere" not found`)
		o, err = sshOut(t, carol, "proxy", "-s", "proxy:node-1:0@leaf")
		require.Error(t, err)
		require.Contains(t, o, `cluster "leaf" not found`)
		o, err = sshOut(t, carol, "proxy", "-s", proxyapi.SubsystemNodes+"@leaf")
		require.Error(t, err)
		require.Contains(t, o, `cluster "leaf" not found`)
		sitesOut, err := exec.Command("ssh", "-F", carol, "proxy", "-s", proxyapi.SubsystemSites).Output()
		require.NoError(t, err)
		var sites []proxyapi.Site
		require.NoError(t, json.Unmarshal(sitesOut, &sites))
		require.Len(t, sites, 1, "a leaf carol may not reach is not listed")

		denied := findEvent(t, leaf.dataDir, events.AccessDenied, func(e events.Event) bool { return e.User == "carol" })
		require.Contains(t, denied.Fields[events.FieldReason], `roles [auditor] of user "carol" of cluster "root" map to no role here`)
		rootDenied := findEvent(t, root.dataDir, events.AccessDenied, func(e events.Event) bool { return e.User == "carol" })
		require.Equal(t, "leaf", rootDenied.Fields[events.FieldRemoteCluster])
	})
	t.Run("removing and re-adding trust", func(t *testing.T) {
		mustPctl(t, leaf.dataDir, "", "rm", "trusted_cluster/root")
		start := time.Now()
		require.Eventually(t, func() bool {
			_, err := sshOut(t, alice, "node-1.leaf", "true")
			return err != nil
		}, 5*time.Second, 50*time.Millisecond, "removing trust must fail new sessions within 5s")
		t.Logf("new sessions fail %v after pctl rm", time.Since(start))
		require.Contains(t, jumpRefusal(t, alice, "node-1.leaf"), `node "node-1.leaf" not found in cluster "root"`)
		o, err := sshOut(t, alice, "proxy", "-s", "proxy:node-1:0@leaf")
		require.Error(t, err)
		require.Contains(t, o, `cluster "leaf" not found`)

		mustPctl(t, root.dataDir, "", "clusters", "rm", "leaf")
		establishTrust(t, root, leaf, roleMap)
		require.Eventually(t, func() bool {
			_, err := sshOut(t, alice, "node-1.leaf", "true")
			return err == nil
		}, 30*time.Second, 200*time.Millisecond, "trust re-established with a new token reaches the leaf again")

		// Removed on the root this time: the root proxy cuts the leaf's
		// tunnel at its next CA check.
		mustPctl(t, root.dataDir, "", "clusters", "rm", "leaf")
		start = time.Now()
		require.Eventually(t, func() bool {
			_, err := sshOut(t, alice, "node-1.leaf", "true")
			return err != nil
		}, 5*time.Second, 50*time.Millisecond, "pctl clusters rm must fail new sessions within 5s")
		t.Logf("new sessions fail %v after pctl clusters rm", time.Since(start))
	})
}

// leafHostCAKnownHosts is known_hosts for root users: the root's CA line
// from `pctl auth sign` and leaf's host CA (as the root stored it at the
// exchange) scoped to *.LEAF.
func leafHostCAKnownHosts(t *testing.T, root *allInOne, leafName string) string {
	t.Helper()
	cas, err := adminClient(t, root.dataDir, root.p).GetCertAuthorities(t.Context(), "host", false)
	require.NoError(t, err)
	rootKH, err := os.ReadFile(root.keyPath + ".known_hosts")
	require.NoError(t, err)
	b := string(rootKH)
	found := false
	for _, ca := range cas {
		if ca.ClusterName != leafName {
			continue
		}
		for _, k := range ca.SSHPublicKeys {
			b += "@cert-authority *." + leafName + " " + strings.TrimSpace(k) + "\n"
			found = true
		}
	}
	require.True(t, found, "the root holds the host CA of %q", leafName)
	path := filepath.Join(t.TempDir(), "known_hosts")
	require.NoError(t, os.WriteFile(path, []byte(b), 0o600))
	return path
}

// TestLeafThroughPeerProxy: the root has two proxies; the leaf (a
// process in a network namespace, no inbound route) can reach only the
// first one's tunnel port (the second's listens on loopback, which the
// namespace cannot reach), so it keeps one tunnel, to the first. A user
// on the second proxy still reaches the leaf's node: the second proxy
// finds the first's lease for the leaf's tunnel and dials through it
// (peering), with stock OpenSSH and the leaf's host CA.
func TestLeafThroughPeerProxy(t *testing.T) {
	requireOpenSSH(t, "ssh")
	ns := newNetNS(t)
	root := newAllInOneWith(t, func(cfg *config.Config) {
		cfg.ClusterName = "root"
		cfg.WebAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.TunnelAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.PublicAddrs = []string{ns.hostIP}
	})
	m := joinRe.FindStringSubmatch(mustPctl(t, root.dataDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	cfg2 := procConfig(t.TempDir(), config.RoleProxy)
	cfg2.ClusterName = "root"
	cfg2.AuthServer, cfg2.Token, cfg2.CAPin, cfg2.NodeName = root.p.Addr(service.ListenerAuth).String(), m[1], m[2], "edge-2"
	p2 := startProcess(t, cfg2)
	waitProxies(t, adminClient(t, root.dataDir, root.p), 2)

	dir := t.TempDir()
	leaf := &nsNode{dataDir: dir, stderr: &syncBuffer{}}
	leaf.start(t, ns, []string{"start", "--roles", "auth,proxy,node", "--cluster-name", "leaf", "--data-dir", dir,
		"--nodename", "leaf-node", "--diag-addr", "127.0.0.1:0"})
	nsPctl := func(args ...string) (string, error) {
		out, err := ns.command(bin("pctl"), append([]string{"--data-dir", dir}, args...)...).CombinedOutput()
		return string(out), err
	}
	require.Eventually(t, func() bool {
		out, err := nsPctl("nodes", "ls")
		return err == nil && strings.Contains(out, "leaf-node")
	}, 30*time.Second, 200*time.Millisecond, "the leaf never came up:\n%s", leaf.stderr)
	path := filepath.Join(t.TempDir(), "trusted_cluster.yaml")
	_, webPort, err := net.SplitHostPort(root.p.Addr(service.ListenerWeb).String())
	require.NoError(t, err)
	body := "kind: trusted_cluster\nmetadata: {name: root}\nspec:\n  enabled: true\n  proxy_addr: " +
		net.JoinHostPort(ns.hostIP, webPort) + "\n  token: " + trustToken(t, root) + "\n  role_map: [{remote: access, local: [access]}]\n"
	require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
	out, err := nsPctl("create", "-f", path)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool { return metric(getMetrics(t, root.p), "postern_leaf_tunnels") == 1 }, 30*time.Second, 200*time.Millisecond,
		"the leaf's tunnel never reached the first root proxy; its log:\n%s", leaf.stderr)
	require.Equal(t, 0.0, metric(getMetrics(t, p2), "postern_leaf_tunnels"), "the second root proxy holds no tunnel from the leaf")

	kh := leafHostCAKnownHosts(t, root, "leaf")
	// The proxy holding the tunnel reaches the namespace's node, which
	// nothing on the host can connect to.
	viaP1 := leafSSHConfig(t, root.p.Addr(service.ListenerProxySSH), root.login, root.keyPath, kh, "leaf")
	out, err = sshOut(t, viaP1, "leaf-node.leaf", "echo $SSH_POSTERN_CLUSTER_NAME")
	require.NoError(t, err, out)
	require.Equal(t, "leaf\n", out)
	viaP2 := leafSSHConfig(t, p2.Addr(service.ListenerProxySSH), root.login, root.keyPath, kh, "leaf")
	require.Eventually(t, func() bool {
		_, err := sshOut(t, viaP2, "leaf-node.leaf", "true")
		return err == nil
	}, 10*time.Second, 100*time.Millisecond, "the second proxy learns the first one's lease")
	out, err = sshOut(t, viaP2, "leaf-node.leaf", "echo $SSH_POSTERN_USER $SSH_POSTERN_CLUSTER_NAME")
	require.NoError(t, err, out)
	require.Equal(t, "alice leaf\n", out)
	nodes, err := exec.Command("ssh", "-F", viaP2, "proxy", "-s", "nodes@leaf").Output()
	require.NoError(t, err)
	require.Contains(t, string(nodes), `"hostname":"leaf-node"`)
	require.Equal(t, 0.0, metric(getMetrics(t, p2), "postern_leaf_tunnels"), "through peering, not a tunnel of its own")
	require.False(t, strings.Contains(leaf.stderr.String(), "panic"))
}

// openLeafTerm opens a web terminal with params on wc's proxy, types
// input and reads until the screen matches re (or a terminal error).
func openLeafTerm(t *testing.T, ctx context.Context, wc *webTermClient, params webterm.TerminalParams, input string, re *regexp.Regexp) (string, error) {
	t.Helper()
	p, err := json.Marshal(params)
	require.NoError(t, err)
	ws, _, err := websocket.Dial(ctx, "wss://"+wc.addr+"/webapi/terminal?params="+url.QueryEscape(string(p)), &websocket.DialOptions{
		HTTPClient:   wc.hc,
		HTTPHeader:   http.Header{"Cookie": {web.SessionCookieName + "=" + wc.cookie.Value}},
		Subprotocols: []string{webterm.TerminalSubprotocol},
	})
	require.NoError(t, err)
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	ack := uint64(0)
	first, err := json.Marshal(webterm.AuthMessage{Token: wc.token, Ack: &ack})
	require.NoError(t, err)
	require.NoError(t, ws.Write(ctx, websocket.MessageText, first))
	_, msg, err := ws.Read(ctx)
	require.NoError(t, err)
	require.JSONEq(t, `{"status":"ok"}`, string(msg))
	require.NoError(t, ws.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameData, []byte(input))))
	var screen strings.Builder
	for {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			return screen.String(), err
		}
		f, err := webterm.DecodeFrame(msg)
		require.NoError(t, err)
		switch f.Type {
		case webterm.FrameError:
			return screen.String(), errors.New(string(f.Payload))
		case webterm.FrameData:
			_, data, err := webterm.DecodeSeq(f.Payload)
			require.NoError(t, err)
			screen.Write(data)
		}
		if re.MatchString(screen.String()) {
			return screen.String(), nil
		}
	}
}

// webGet GETs path on wc's proxy with its session.
func webGet(t *testing.T, wc *webTermClient, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+wc.addr+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+wc.token)
	req.AddCookie(wc.cookie)
	resp, err := wc.hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, body
}

// TestLeafWebBackend: a root user's browser session on the root proxy
// lists the clusters it may reach (GET /webapi/clusters, the proxysites
// set), a leaf's nodes as the leaf shows them (GET
// /webapi/nodes?cluster=leaf; an unknown cluster is 404 `cluster "X" not
// found`), and opens a terminal on a leaf node (params cluster=leaf), its
// host certificate checked against the leaf's host CA; the root audits
// the route.
func TestLeafWebBackend(t *testing.T) {
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")
	establishTrust(t, root, leaf, "[{remote: access, local: [access]}]")
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 30*time.Second, 100*time.Millisecond)
	wc := webTermLogin(t, root)

	code, body := webGet(t, wc, "/webapi/clusters")
	require.Equal(t, http.StatusOK, code, string(body))
	var clusters webapi.ClustersResponse
	require.NoError(t, json.Unmarshal(body, &clusters))
	require.Len(t, clusters.Items, 2, string(body))
	require.Equal(t, webapi.ClusterEntry{Name: "root", Status: "online", Local: true}, webapi.ClusterEntry{Name: clusters.Items[0].Name, Status: clusters.Items[0].Status, Local: clusters.Items[0].Local})
	require.Equal(t, "leaf", clusters.Items[1].Name)
	require.Equal(t, "online", clusters.Items[1].Status)
	require.False(t, clusters.Items[1].Local)
	require.False(t, clusters.Items[1].LastConnected.IsZero())

	code, body = webGet(t, wc, "/webapi/nodes?cluster=leaf")
	require.Equal(t, http.StatusOK, code, string(body))
	var nodes webapi.NodesResponse
	require.NoError(t, json.Unmarshal(body, &nodes))
	require.Len(t, nodes.Items, 1)
	require.Equal(t, "node-1", nodes.Items[0].Hostname)
	require.Equal(t, "leaf", nodes.Items[0].Cluster)
	code, body = webGet(t, wc, "/webapi/nodes?cluster=nowhere")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, string(body), `cluster \"nowhere\" not found`)
	code, body = webGet(t, wc, "/webapi/nodes?cluster=root")
	require.Equal(t, http.StatusOK, code, string(body))
	require.Contains(t, string(body), `"cluster":"root"`)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	screen, err := openLeafTerm(t, ctx, wc, webterm.TerminalParams{Host: nodes.Items[0].UUID, Login: root.login, Cols: 80, Rows: 24, Cluster: "leaf"},
		"echo in-$SSH_POSTERN_CLUSTER_NAME-$SSH_POSTERN_USER\n", regexp.MustCompile(`in-leaf-alice`))
	require.NoError(t, err, screen)
	e := findEvent(t, root.dataDir, events.RouteLeaf, func(e events.Event) bool { return e.Fields[events.FieldKind] == "terminal" })
	require.Equal(t, "leaf", e.Fields[events.FieldRemoteCluster])
	require.Equal(t, "alice", e.User)

	_, err = openLeafTerm(t, ctx, wc, webterm.TerminalParams{Host: "ghost", Login: root.login, Cols: 80, Rows: 24, Cluster: "leaf"}, "", regexp.MustCompile(`never`))
	require.ErrorContains(t, err, `node "ghost" not found in cluster "leaf"`)
	_, err = openLeafTerm(t, ctx, wc, webterm.TerminalParams{Host: "node-1", Login: root.login, Cols: 80, Rows: 24, Cluster: "nowhere"}, "", regexp.MustCompile(`never`))
	require.ErrorContains(t, err, `cluster "nowhere" not found`)
}
