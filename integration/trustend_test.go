package integration

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
)

// openRootShell opens an interactive shell over clt and waits for it to
// answer; it returns the session, its merged output and a channel that
// gets Wait's result.
func openRootShell(t *testing.T, clt *ssh.Client) (*ssh.Session, *syncBuffer, <-chan error) {
	t.Helper()
	s, err := clt.NewSession()
	require.NoError(t, err)
	out := &syncBuffer{}
	s.Stdout, s.Stderr = out, out
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	require.NoError(t, s.Shell())
	_, err = stdin.Write([]byte("echo shell-$((6*7))\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "shell-42") }, 10*time.Second, 20*time.Millisecond, "the shell never answered: %q", out.String())
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	return s, out, done
}

// TestLeafTrustRemovalEndsRootShells is the attack of a root user who
// keeps a shell open on a leaf node after the leaf's admin withdrew trust
// in the root: `pctl rm trusted_cluster/root` on the leaf refused new
// connections, but the open shells ran on. Now both shells, one opened
// through the leaf's proxy and one routed through the root's proxy and
// the leaf's tunnel, end within 5s, the user reads why, and the leaf's
// audit log has a conn.terminated event with the reason.
func TestLeafTrustRemovalEndsRootShells(t *testing.T) {
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")
	establishTrust(t, root, leaf, "[{remote: access, local: [access]}]")
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 30*time.Second, 100*time.Millisecond)

	viaLeaf, err := jumpWith(leaf, foreignClientConfig(t, root.login, root.keyPath, leaf.keyPath+".known_hosts"), "node-1:0")
	require.NoError(t, err)
	t.Cleanup(func() { viaLeaf.Close() })
	viaRoot, err := jumpWith(root, foreignClientConfig(t, root.login, root.keyPath, leafKnownHosts(t, root, leaf, "leaf")), "node-1.leaf:0")
	require.NoError(t, err)
	t.Cleanup(func() { viaRoot.Close() })
	_, outLeaf, doneLeaf := openRootShell(t, viaLeaf)
	_, outRoot, doneRoot := openRootShell(t, viaRoot)

	mustPctl(t, leaf.dataDir, "", "rm", "trusted_cluster/root")
	start := time.Now()
	for name, done := range map[string]<-chan error{"through the leaf proxy": doneLeaf, "through the root proxy": doneRoot} {
		select {
		case <-done:
		case <-time.After(5*time.Second - time.Since(start)):
			t.Fatalf("the shell opened %s still runs 5s after pctl rm trusted_cluster/root", name)
		}
	}
	t.Logf("both shells ended %v after pctl rm", time.Since(start))
	// Removing the trust deletes the trusted_cluster record, then the
	// root's CAs. The leaf's servers follow the two through separate
	// watch streams of the auth API, so either change may reach them
	// first, and each is a true reason.
	why := regexp.MustCompile(`cluster "root" is no longer trusted here \(its trusted_cluster was removed\)|the user CA of cluster "root" is no longer held here`)
	require.Regexp(t, why, outLeaf.String())
	require.Regexp(t, why, outRoot.String())

	var ended []events.Event
	require.Eventually(t, func() bool {
		ended = ended[:0]
		for _, e := range eventsLs(t, leaf.dataDir) {
			// The node's two (the leaf proxy's own hop ends too).
			if e.Type == events.ConnTerminated && e.User == "alice" && e.Fields[events.FieldServerID] != nil {
				ended = append(ended, e)
			}
		}
		return len(ended) >= 2
	}, 10*time.Second, 100*time.Millisecond, "conn.terminated events of the node for both of alice's connections")
	for _, e := range ended {
		require.Regexp(t, why, e.Fields[events.FieldReason])
		require.Equal(t, "root", e.Fields[events.FieldUserCluster])
	}
}
