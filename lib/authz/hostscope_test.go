package authz_test

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// TestScopedHostKeyCallback: a leaf's host CA vouches only for *.LEAF
// names. A certificate it signed for a root host's name (or another
// leaf's) is refused, however its principals read; the root's CA still
// vouches for every name.
func TestScopedHostKeyCallback(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	now := clock.Now()
	rootCA, leafCA := srvtest.NewSigner(t), srvtest.NewSigner(t)
	hostKey := srvtest.NewSigner(t).PublicKey()
	auths := []authz.HostAuthority{
		{Key: rootCA.PublicKey(), Patterns: authz.HostAuthorityPatterns("root", "root")},
		{Key: leafCA.PublicKey(), Patterns: authz.HostAuthorityPatterns("leaf", "root")},
	}
	check := authz.ScopedHostKeyCallback(auths, clock)
	sign := func(ca ssh.Signer, principals ...string) *ssh.Certificate {
		return signHost(t, ca, hostKey, ssh.HostCert, principals, now.Add(-time.Minute), now.Add(time.Hour))
	}

	leafNode := sign(leafCA, "db", "db.leaf", "10.0.0.5")
	require.NoError(t, check("db.leaf:22", nil, leafNode))
	require.NoError(t, check("DB.Leaf:22", nil, sign(leafCA, "DB.Leaf")), "case-insensitive, as OpenSSH")
	require.NoError(t, check("node-1:22", nil, sign(rootCA, "node-1")))
	require.NoError(t, check("db.leaf:22", nil, sign(rootCA, "db.leaf")), "the root's CA vouches for every name")

	for name, c := range map[string]struct {
		addr string
		key  ssh.PublicKey
	}{
		"a leaf CA signing a root host's name": {"node-1:3022", sign(leafCA, "node-1", "node-1.root")},
		"the same certificate, plain name":     {"db:22", leafNode},
		"an IP through the leaf's CA":          {"10.0.0.5:22", leafNode},
		"the root's own name suffix":           {"node-1.root:22", sign(leafCA, "node-1.root")},
		"another leaf's names":                 {"db.other:22", sign(leafCA, "db.other")},
		"a suffix that is not a label":         {"dbleaf:22", sign(leafCA, "dbleaf")},
		"a name ending in .leaf elsewhere":     {"db.leaf.evil:22", sign(leafCA, "db.leaf.evil")},
	} {
		t.Run(name, func(t *testing.T) {
			err := check(c.addr, nil, c.key)
			require.ErrorContains(t, err, `trusted only for *.leaf`)
		})
	}
}

func TestHostAuthorityPatterns(t *testing.T) {
	for _, c := range []struct {
		patterns []string
		host     string
		want     bool
	}{
		{[]string{"*"}, "anything", true},
		{[]string{"*.leaf"}, "a.b.leaf", true},
		{[]string{"*.leaf"}, "leaf", false},
		{[]string{"*.leaf"}, ".leaf", true},
		{[]string{"n?de.leaf"}, "node.leaf", true},
		{[]string{"*", "!bad.*"}, "bad.leaf", false},
		{nil, "x", false},
	} {
		require.Equal(t, c.want, authz.HostAuthority{Patterns: c.patterns}.VouchesFor(c.host), "%v %q", c.patterns, c.host)
	}
	require.Equal(t, "db.leaf", authz.ClusterHostName("db", "leaf", "root"))
	require.Equal(t, "db.LEAF", authz.ClusterHostName("db.LEAF", "leaf", "root"))
	require.Equal(t, "db", authz.ClusterHostName("db", "root", "root"))
	require.Equal(t, "db", authz.ClusterHostName("db", "", "root"))
}
