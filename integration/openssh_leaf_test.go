package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// TestOpenSSHNodeInLeafCluster: Debian's sshd registered in a leaf
// cluster, reached by a root cluster's user through the root proxy.
//
// The sshd trusts the leaf's user CA only, and enforces a certificate's
// logins: the root user's own certificate cannot log in there (and must
// not: its logins are the root roles', not the role_map's). The root
// proxy's web terminal logs in with a certificate the leaf's auth signs
// for the session's key, naming the logins the mapped roles allow on the
// node, and records the session in the root cluster (the only place it
// is seen in clear): with the root's session_recording off, because a
// leaf role the user is mapped to requires a recording. The recording
// plays back, its hash chain verifies and the user's own listing shows
// it. `psh ssh` (a spliced hop) to the node is refused at the root with
// the reason, and the leaf's listing through the root shows the node as
// openssh and online.
func TestOpenSSHNodeInLeafCluster(t *testing.T) {
	d := srvtest.StartSSHD(t, srvtest.SSHDConfig{})
	root := newNamedCluster(t, "root")
	leaf := newNamedCluster(t, "leaf")

	// The root records nothing by itself.
	netCfg := filepath.Join(t.TempDir(), "netcfg.yaml")
	require.NoError(t, os.WriteFile(netCfg, []byte("kind: cluster_networking_config\nmetadata:\n  name: cluster_networking_config\nspec:\n  session_recording: \"off\"\n"), 0o600))
	mustPctl(t, root.dataDir, "", "create", "-f", netCfg)
	// The leaf requires a recording of the mapped user's sessions.
	createRole(t, leaf.dataDir, fmt.Sprintf("kind: role\nmetadata: {name: audited}\nspec:\n  logins: [%s]\n  node_labels: {'*': '*'}\n  session_recording: require\n", leaf.login))
	establishTrust(t, root, leaf, "[{remote: access, local: [access, audited]}]")
	require.Eventually(t, func() bool { return clusterStatus(t, root, "leaf") == "online" }, 30*time.Second, 100*time.Millisecond)

	// The leaf's admin registers the server (its key given) and sshd
	// takes the snippet.
	keyFile := filepath.Join(t.TempDir(), "host.pub")
	require.NoError(t, os.WriteFile(keyFile, ssh.MarshalAuthorizedKey(d.HostKey), 0o600))
	out := filepath.Join(t.TempDir(), "legacy")
	mustPctl(t, leaf.dataDir, "", "nodes", "add-openssh", "--name", "legacy", "--addr", d.Addr, "--host-key", keyFile, "--out", out)
	d.Stop()
	d.Reconfigure(t, "Include "+filepath.Join(out, "sshd_config.snippet"))
	d.Start(t)

	wc := webTermLogin(t, root)
	var last string
	var uuid string
	require.Eventually(t, func() bool {
		code, body := webGet(t, wc, "/webapi/nodes?cluster=leaf")
		last = fmt.Sprintf("%d %s", code, body)
		if code != 200 {
			return false
		}
		var nodes webapi.NodesResponse
		if err := json.Unmarshal(body, &nodes); err != nil {
			return false
		}
		for _, n := range nodes.Items {
			if n.Hostname == "legacy" && n.Kind == "openssh" && n.Status == "online" {
				uuid = n.UUID
				return true
			}
		}
		return false
	}, 60*time.Second, 250*time.Millisecond, "the leaf's node list through the root: %s", last)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The leaf's checker may not have seen the certificate yet: the
	// terminal is retried until the node is online there too.
	var screen string
	require.Eventually(t, func() bool {
		var err error
		screen, err = openLeafTerm(t, ctx, wc, webterm.TerminalParams{Host: "legacy", Login: root.login, Cols: 80, Rows: 24, Cluster: "leaf"},
			"echo leaf-$((6*7))-openssh-$(whoami); exit 3\r", regexp.MustCompile(`leaf-42-openssh-`+regexp.QuoteMeta(root.login)))
		last = fmt.Sprintf("%v: %q", err, screen)
		return err == nil
	}, 45*time.Second, 500*time.Millisecond, "web terminal to the leaf's OpenSSH node: %s", last)

	// Recorded at the root, under the leaf's node, although the root
	// says off: the leaf's role requires it.
	recRe := regexp.MustCompile(`(?m)^([0-9a-f-]{36})\b.*\blegacy\b.*\btrue\b`)
	var sid string
	require.Eventually(t, func() bool {
		last, _, _ = pctl(t, root.dataDir, "", "recordings", "ls")
		m := recRe.FindStringSubmatch(last)
		if m != nil {
			sid = m[1]
		}
		return m != nil
	}, 30*time.Second, 200*time.Millisecond, "no complete recording at the root: %s", last)
	cast := mustPctl(t, root.dataDir, "", "recordings", "export", sid)
	require.Contains(t, cast, "leaf-42-openssh-"+root.login)
	require.Contains(t, cast, "exit-status 3")
	require.Contains(t, mustPctl(t, root.dataDir, "", "recordings", "verify", sid), "hash chain intact")
	e := findEventJSON(t, root.dataDir, "session.start", sid)
	require.Contains(t, e, `"recorded":true`)
	require.Contains(t, e, `"server_id":"`+uuid+`"`)
	// The user's own recordings, as the root's RBAC shows them.
	code, body := webGet(t, wc, "/webapi/recordings")
	require.Equal(t, 200, code, string(body))
	require.Contains(t, string(body), sid)
	// The leaf stores nothing of it.
	require.NotContains(t, mustPctl(t, leaf.dataDir, "", "recordings", "ls"), sid)

	// A spliced hop cannot log in with the root's certificate: refused
	// at the root, saying why.
	pe := newPshEnv(t, root)
	pe.login(t, "alice", alicePassword+"\n")
	_, errOut, code2 := pe.run(t, "", "ssh", "legacy.leaf", "true")
	require.Equal(t, 255, code2, errOut)
	require.Contains(t, errOut, `node "legacy.leaf" is an OpenSSH server of leaf cluster "leaf"`)
}

// findEventJSON is the JSON line of root's event of type typ for session
// sid, awaited (the backend follows the event log asynchronously).
func findEventJSON(t *testing.T, dataDir, typ, sid string) string {
	t.Helper()
	var last, line string
	require.Eventually(t, func() bool {
		last = mustPctl(t, dataDir, "", "events", "ls", "--type", typ, "--format", "json")
		for _, l := range strings.Split(last, "\n") {
			if strings.Contains(l, `"session_id":"`+sid+`"`) {
				line = l
				return true
			}
		}
		return false
	}, 20*time.Second, 100*time.Millisecond, "%s of %s: %s", typ, sid, last)
	return line
}
