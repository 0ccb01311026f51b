package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// newNamedCluster is an all-in-one cluster (auth, proxy, node) named name.
func newNamedCluster(t *testing.T, name string) *allInOne {
	t.Helper()
	return newAllInOneWith(t, func(cfg *config.Config) { cfg.ClusterName = name })
}

var trustTokenRe = regexp.MustCompile(`token: (\S+@sha256:[0-9a-f]{64})\n`)

// trustToken runs `pctl tokens add --type trusted_cluster` on the root and
// returns the token from the resource it prints.
func trustToken(t *testing.T, root *allInOne) string {
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
	require.Regexp(t, `(?m)^leaf\s+\d{4}-`, out)
	out = mustPctl(t, leaf.dataDir, "", "get", "trusted_cluster", "root")
	require.Contains(t, out, "proxy_addr: "+root.p.Addr(service.ListenerWeb).String())
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
	require.Contains(t, errOut, `pctl rm does not remove kind "role"`)
}
