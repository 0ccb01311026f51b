package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRoleEditReachesCachedNode: the node and the proxy check roles from
// memory (services.AccessCache), yet a role tightened by `pctl create`
// applies within seconds, to the next session of a connection that is
// already open and to new connections, and a role widened again lets
// them back in: at the all-in-one's own node (the backend's watch) and at
// a joined node (the auth API's access watch).
func TestRoleEditReachesCachedNode(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	c.joinNode(t, "node-2", map[string]string{"env": "it"})
	waitNodes(t, clt, 2)
	for _, host := range []string{c.hostname, "node-2"} {
		t.Run(host, func(t *testing.T) { roleEditReaches(t, c, host) })
	}
}

func roleEditReaches(t *testing.T, c *allInOne, host string) {
	clt := adminClient(t, c.dataDir, c.p)
	role := func(env string) string {
		return fmt.Sprintf("kind: role\nmetadata: {name: editable}\nspec:\n  logins: [%s]\n  node_labels: {env: %s}\n", c.login, env)
	}
	createRole(t, c.dataDir, role("it"))
	if _, _, err := pctl(t, c.dataDir, "password-gina\n", "users", "add", "gina", "--logins", c.login, "--roles", "editable"); err != nil {
		t.Logf("gina exists already: %v", err)
	}
	gina := issueCert(t, clt, "gina", 10*time.Minute)
	target := net.JoinHostPort(host, "0")

	open, err := c.jumpWith(t, gina.signer(t, nil), c.login, target)
	require.NoError(t, err)

	createRole(t, c.dataDir, role("prod"))
	start := time.Now()
	require.Eventually(t, func() bool {
		s, err := open.NewSession()
		if err != nil {
			require.ErrorContains(t, err, "prohibited")
			return true
		}
		s.Close()
		return false
	}, 5*time.Second, 20*time.Millisecond, "the open connection's next session is refused")
	t.Logf("role edit applied to an open connection after %v", time.Since(start))
	_, err = c.jumpWith(t, gina.signer(t, nil), c.login, target)
	require.Error(t, err, "a new connection is refused too")

	createRole(t, c.dataDir, role("it"))
	require.Eventually(t, func() bool {
		s, err := open.NewSession()
		if err != nil {
			return false
		}
		s.Close()
		return true
	}, 5*time.Second, 20*time.Millisecond, "widened again, the open connection gets sessions")
}
