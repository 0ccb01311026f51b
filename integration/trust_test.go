package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// newNamedCluster is an all-in-one cluster (auth, proxy, node) named name.
func newNamedCluster(t testing.TB, name string) *allInOne {
	t.Helper()
	return newAllInOneWith(t, func(cfg *config.Config) { cfg.ClusterName = name })
}

var trustTokenRe = regexp.MustCompile(`token: (\S+@sha256:[0-9a-f]{64})\n`)

// trustToken runs `pctl tokens add --type trusted_cluster` on the root and
// returns the token from the resource it prints.
func trustToken(t testing.TB, root *allInOne) string {
	t.Helper()
	out := mustPctl(t, root.dataDir, "", "tokens", "add", "--type", "trusted_cluster")
	m := trustTokenRe.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	return m[1]
}

// trustFile writes a trusted_cluster resource naming root.
func trustFile(t *testing.T, root *allInOne, rootName, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trusted_cluster.yaml")
	body := "kind: trusted_cluster\nmetadata: {name: " + rootName + "}\nspec:\n  enabled: true\n  proxy_addr: " +
		root.p.Addr(service.ListenerWeb).String() + "\n  token: " + token + "\n  role_map: [{remote: access, local: [access]}]\n"
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// TestTrustedClusterLifecycle drives trust between two real clusters
// with the pctl binary only, as an operator would: the root makes a
// token, the leaf creates a trusted_cluster with it (its auth server
// reaches the root's auth through the root proxy's web port), the root
// lists the leaf; a reused token, a leaf claiming the root's name and a
// second leaf claiming the first one's name are refused with clear errors
// and change nothing; trust is removed on both sides and re-established
// with a new token.
func TestTrustedClusterLifecycle(t *testing.T) {
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")

	tok := trustToken(t, root)
	file := trustFile(t, root, "root", tok)
	out := mustPctl(t, leaf.dataDir, "", "create", "-f", file)
	require.Contains(t, out, `trusted_cluster "root" saved`)

	out = mustPctl(t, root.dataDir, "", "clusters", "ls")
	require.Regexp(t, `(?m)^leaf\s+(online|offline)\s+\S+\s+\d{4}-`, out)
	out = mustPctl(t, leaf.dataDir, "", "get", "trusted_cluster", "root")
	require.Contains(t, out, "proxy_addr: "+root.p.Addr(service.ListenerWeb).String())
	// What pctl get prints goes back into pctl create: an edited role map
	// of an established trust is saved without a new token.
	edited := filepath.Join(t.TempDir(), "edited.yaml")
	require.NoError(t, os.WriteFile(edited, []byte(strings.Replace(out, "remote: access", "remote: '*'", 1)), 0o600))
	require.Contains(t, mustPctl(t, leaf.dataDir, "", "create", "-f", edited), `trusted_cluster "root" saved`)
	require.Contains(t, mustPctl(t, leaf.dataDir, "", "get", "trusted_cluster", "root"), "remote: '*'")
	// Each side holds the other's CAs.
	rootCAs, err := adminClient(t, root.dataDir, root.p).GetCertAuthorities(t.Context(), "host", false)
	require.NoError(t, err)
	require.Len(t, rootCAs, 2)
	leafCAs, err := adminClient(t, leaf.dataDir, leaf.p).GetCertAuthorities(t.Context(), "user", false)
	require.NoError(t, err)
	require.Len(t, leafCAs, 2)

	// The token is spent: a second leaf cannot use it.
	other := newNamedCluster(t, "other")
	_, errOut, err := pctl(t, other.dataDir, "", "create", "-f", trustFile(t, root, "root", tok))
	require.Error(t, err)
	require.Contains(t, errOut, "join token not found or already used")
	require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)

	// A cluster named like the root, or like the existing leaf, is refused
	// (before the token is spent: the same token then works for "other").
	tok2 := trustToken(t, root)
	for name, want := range map[string]string{
		"root": `the leaf cluster is named "root", like this root cluster`,
		"leaf": `cluster "leaf" is already a leaf of this cluster`,
	} {
		impostor := newNamedCluster(t, name)
		_, errOut, err := pctl(t, impostor.dataDir, "", "create", "-f", trustFile(t, root, "root", tok2))
		require.Error(t, err, name)
		if name == "root" {
			// A leaf named like its root is already refused locally.
			want = "that is this cluster's own name"
		}
		require.Contains(t, errOut, want, name)
	}
	mustPctl(t, other.dataDir, "", "create", "-f", trustFile(t, root, "root", tok2))
	out = mustPctl(t, root.dataDir, "", "clusters", "ls")
	require.Contains(t, out, "other")

	// A token without its pin is refused by the file check, before any
	// network call.
	bare := strings.SplitN(trustToken(t, root), "@", 2)[0]
	_, errOut, err = pctl(t, leaf.dataDir, "", "create", "-f", trustFile(t, root, "root", bare))
	require.Error(t, err)
	require.Contains(t, errOut, "SECRET@sha256:HEX")

	// Removal on both sides, then a new token re-establishes trust.
	out = mustPctl(t, leaf.dataDir, "", "rm", "trusted_cluster/root")
	require.Contains(t, out, `trusted_cluster "root" removed`)
	_, errOut, err = pctl(t, leaf.dataDir, "", "get", "trusted_cluster", "root")
	require.Error(t, err)
	require.Contains(t, errOut, `trusted_cluster "root" not found`)
	out = mustPctl(t, root.dataDir, "", "clusters", "rm", "leaf")
	require.Contains(t, out, `leaf cluster "leaf" removed`)
	_, errOut, err = pctl(t, root.dataDir, "", "clusters", "rm", "leaf")
	require.Error(t, err)
	require.Contains(t, errOut, `remote cluster "leaf" not found`)
	mustPctl(t, leaf.dataDir, "", "create", "-f", trustFile(t, root, "root", trustToken(t, root)))
	require.Contains(t, mustPctl(t, root.dataDir, "", "clusters", "ls"), "leaf")

	_, errOut, err = pctl(t, leaf.dataDir, "", "rm", "role/access")
	require.Error(t, err)
	require.Contains(t, errOut, `role "access" is a preset role and cannot be removed`)
	_, errOut, err = pctl(t, leaf.dataDir, "", "rm", "user/alice")
	require.Error(t, err)
	require.Contains(t, errOut, `pctl rm does not remove kind "user"`)
}

// establishTrust makes leaf a leaf of root with roleMap (YAML flow list).
func establishTrust(t testing.TB, root, leaf *allInOne, roleMap string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trusted_cluster.yaml")
	body := "kind: trusted_cluster\nmetadata: {name: " + clusterNameOf(t, root) + "}\nspec:\n  enabled: true\n  proxy_addr: " +
		root.p.Addr(service.ListenerWeb).String() + "\n  token: " + trustToken(t, root) + "\n  role_map: " + roleMap + "\n"
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	mustPctl(t, leaf.dataDir, "", "create", "-f", path)
}

func clusterNameOf(t testing.TB, c *allInOne) string {
	t.Helper()
	id, err := auth.ReadIdentity(config.AdminIdentityDir(c.dataDir))
	require.NoError(t, err)
	return id.ClusterName
}

// signedUser adds a user on c with roles and signs a certificate for it
// (`pctl auth sign`); it returns the key path.
func signedUser(t *testing.T, c *allInOne, name, roles string) string {
	t.Helper()
	args := []string{"users", "add", name, "--logins", c.login}
	if roles != "" {
		args = append(args, "--roles", roles)
	}
	mustPctl(t, c.dataDir, "correct horse battery\n", args...)
	keyPath := filepath.Join(t.TempDir(), name)
	mustPctl(t, c.dataDir, "", "auth", "sign", "--user", name, "--ttl", "10m", "--out", keyPath)
	return keyPath
}

// foreignClientConfig is a client config with the certificate at keyPath
// (from one cluster) that checks host certificates against another
// cluster's host CA (hostsFrom's known_hosts).
func foreignClientConfig(t *testing.T, login, keyPath, knownHosts string) *ssh.ClientConfig {
	t.Helper()
	keyPEM, err := os.ReadFile(keyPath)
	require.NoError(t, err)
	signer, err := ssh.ParsePrivateKey(keyPEM)
	require.NoError(t, err)
	certBytes, err := os.ReadFile(keyPath + "-cert.pub")
	require.NoError(t, err)
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	require.NoError(t, err)
	certSigner, err := ssh.NewCertSigner(pub.(*ssh.Certificate), signer)
	require.NoError(t, err)
	return &ssh.ClientConfig{
		User:            login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(certSigner)},
		HostKeyCallback: hostCAChecker(t, knownHosts),
		Timeout:         10 * time.Second,
	}
}

// jumpWith dials target through c's proxy as ssh -J does, with cfg on
// both hops.
func jumpWith(c *allInOne, cfg *ssh.ClientConfig, target string) (*ssh.Client, error) {
	proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
	if err != nil {
		return nil, err
	}
	conn, err := proxy.Dial("tcp", target)
	if err != nil {
		proxy.Close()
		return nil, err
	}
	sconn, chans, reqs, err := ssh.NewClientConn(conn, target, cfg)
	if err != nil {
		proxy.Close()
		return nil, err
	}
	clt := ssh.NewClient(sconn, chans, reqs)
	go func() { clt.Wait(); proxy.Close() }()
	return clt, nil
}

// TestRootUserInLeafCluster: with real processes, a root user's
// certificate (from the root's `pctl auth sign`) is accepted by the
// leaf's proxy and node, with its roles mapped by the leaf's role_map; a
// root user whose roles map to nothing is refused, and the leaf's audit
// log names the unmapped roles and the user's cluster; removing the
// trusted_cluster on the leaf refuses new connections within 5s.
func TestRootUserInLeafCluster(t *testing.T) {
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")
	mustPctl(t, root.dataDir, "", "create", "-f", writeRole(t, "auditor"))
	establishTrust(t, root, leaf, "[{remote: access, local: [access]}]")

	alice := foreignClientConfig(t, root.login, root.keyPath, leaf.keyPath+".known_hosts")
	clt, err := jumpWith(leaf, alice, "node-1:0")
	require.NoError(t, err)
	out, err := run(t, clt, "echo $SSH_POSTERN_USER $SSH_POSTERN_CLUSTER_NAME")
	require.NoError(t, err)
	require.Equal(t, "alice leaf\n", out)
	clt.Close()

	carol := foreignClientConfig(t, root.login, signedUser(t, root, "carol", "auditor"), leaf.keyPath+".known_hosts")
	_, err = jumpWith(leaf, carol, "node-1:0")
	require.Error(t, err)
	require.Contains(t, err.Error(), "unable to authenticate")
	require.NotContains(t, err.Error(), "auditor", "the user is not told the leaf's policy")
	var denied events.Event
	require.Eventually(t, func() bool {
		for _, e := range eventsLs(t, leaf.dataDir) {
			if e.Type == events.AccessDenied && e.User == "carol" {
				denied = e
				return true
			}
		}
		return false
	}, 10*time.Second, 100*time.Millisecond)
	require.Contains(t, denied.Fields[events.FieldReason], `roles [auditor] of user "carol" of cluster "root" map to no role here`)
	require.Equal(t, "root", denied.Fields[events.FieldUserCluster])

	// Leaf users are not root users: the leaf's own alice certificate is
	// refused by the root's proxy (trust is one way).
	leafAlice := foreignClientConfig(t, leaf.login, leaf.keyPath, root.keyPath+".known_hosts")
	_, err = jumpWith(root, leafAlice, "node-1:0")
	require.Error(t, err)

	mustPctl(t, leaf.dataDir, "", "rm", "trusted_cluster/root")
	start := time.Now()
	require.Eventually(t, func() bool {
		c, err := jumpWith(leaf, alice, "node-1:0")
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 5*time.Second, 50*time.Millisecond, "removing trust must cut access within 5s")
	t.Logf("access cut %v after pctl rm", time.Since(start))
}

// writeRole writes a role resource file granting nothing but its name.
func writeRole(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	require.NoError(t, os.WriteFile(path, []byte("kind: role\nmetadata: {name: "+name+"}\nspec: {logins: ['{{internal.logins}}']}\n"), 0o600))
	return path
}

// clusterStatus is the STATUS column of name in the root's
// `pctl clusters ls` ("" when not listed).
func clusterStatus(t testing.TB, root *allInOne, name string) string {
	t.Helper()
	out := mustPctl(t, root.dataDir, "", "clusters", "ls")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == name {
			return f[1]
		}
	}
	return ""
}

// TestLeafTunnelToRoot: once trust is established, the leaf's proxy
// opens a tunnel to the root's tunnel port with a certificate of role
// leaf and the root shows the leaf online with its last connection;
// `pctl clusters rm` on the root cuts the tunnel (the leaf's reconnects
// are refused and audited); re-established trust brings it back, and
// removing the trusted_cluster on the leaf takes it offline.
func TestLeafTunnelToRoot(t *testing.T) {
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")
	establishTrust(t, root, leaf, "[{remote: access, local: [access]}]")
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 20*time.Second, 200*time.Millisecond)
	out := mustPctl(t, root.dataDir, "", "clusters", "ls")
	require.Regexp(t, `(?m)^leaf\s+online\s+\d{4}-\d\d-\d\dT`, out)
	var listed []services.RemoteCluster
	require.NoError(t, json.Unmarshal([]byte(mustPctl(t, root.dataDir, "", "clusters", "ls", "--format", "json")), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, "leaf", listed[0].Name)
	require.Equal(t, "online", listed[0].StatusNow)
	require.False(t, listed[0].LastConnected.IsZero())

	mustPctl(t, root.dataDir, "", "clusters", "rm", "leaf")
	require.Eventually(t, func() bool {
		for _, e := range eventsLs(t, root.dataDir) {
			if e.Type == events.AccessDenied && e.Fields[events.FieldKind] == "tunnel" &&
				strings.Contains(e.Fields[events.FieldReason].(string), `cluster "leaf" is not a leaf of this cluster`) {
				return true
			}
		}
		return false
	}, 20*time.Second, 200*time.Millisecond, "the removed leaf's tunnel is cut and its reconnects refused")

	// Trust again (both sides removed first), then the leaf withdraws it.
	mustPctl(t, leaf.dataDir, "", "rm", "trusted_cluster/root")
	establishTrust(t, root, leaf, "[{remote: access, local: [access]}]")
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 30*time.Second, 200*time.Millisecond)
	mustPctl(t, leaf.dataDir, "", "rm", "trusted_cluster/root")
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "offline" }, 40*time.Second, 500*time.Millisecond)
}

// TestLeafTunnelToEveryRootProxy: a root with two proxies (the
// all-in-one's and a second proxy process joined to its auth); the leaf
// was given the first one's address, learns the second from the root's
// announcements and keeps a tunnel to each (postern_leaf_tunnels on
// both).
func TestLeafTunnelToEveryRootProxy(t *testing.T) {
	root := newNamedCluster(t, "root")
	p2, _ := startRemoteProxy(t, root.dataDir, root.p, "edge-2")
	waitProxies(t, adminClient(t, root.dataDir, root.p), 2)
	leaf := newNamedCluster(t, "leaf")
	establishTrust(t, root, leaf, "[{remote: access, local: [access]}]")
	for _, p := range []*service.Process{root.p, p2} {
		require.Eventually(t, func() bool { return metric(getMetrics(t, p), "postern_leaf_tunnels") == 1 }, 30*time.Second, 200*time.Millisecond,
			"the leaf keeps a tunnel to root proxy %s", p.HostUUID())
	}
	require.Equal(t, "online", clusterStatus(t, root, "leaf"))
}
