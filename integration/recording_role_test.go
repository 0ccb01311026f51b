package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
)

// A role with session_recording: require records its holder's sessions
// through the real processes (auth, proxy, node, pctl) although the
// cluster says off, and pctl refuses a role with any other value, naming
// it.
func TestRoleRequiresRecordingAcrossTheCluster(t *testing.T) {
	c := newAllInOne(t)
	netCfg := filepath.Join(t.TempDir(), "net.yaml")
	require.NoError(t, os.WriteFile(netCfg, []byte("kind: cluster_networking_config\nmetadata:\n  name: cluster_networking_config\nspec:\n  session_recording: \"off\"\n"), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", netCfg)

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(fmt.Sprintf("kind: role\nmetadata: {name: audited}\nspec:\n  logins: [%s]\n  node_labels: {'*': '*'}\n  session_recording: \"off\"\n", c.login)), 0o600))
	_, errOut, err := pctl(t, c.dataDir, "", "create", "-f", bad)
	require.Error(t, err)
	require.Contains(t, errOut, `spec.session_recording: unknown value "off", want "require" or "exempt"`)

	createRole(t, c.dataDir, fmt.Sprintf("kind: role\nmetadata: {name: audited}\nspec:\n  logins: [%s]\n  node_labels: {'*': '*'}\n  session_recording: require\n", c.login))
	mustPctl(t, c.dataDir, "password-rita\n", "users", "add", "rita", "--logins", c.login, "--roles", "audited")
	rita := issueCert(t, adminClient(t, c.dataDir, c.p), "rita", 10*time.Minute)
	clt, err := c.jumpWith(t, rita.signer(t, nil), c.login, net.JoinHostPort(c.hostname, "0"))
	require.NoError(t, err)
	defer clt.Close()
	s, err := clt.NewSession()
	require.NoError(t, err)
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	out, err := s.Output(`echo "audited-$((40+2))"`)
	require.NoError(t, err)
	require.Contains(t, string(out), "audited-42")

	var start *events.Event
	findStart := func() bool {
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.SessionStart && e.User == "rita" {
				start = &e
			}
		}
		return start != nil
	}
	require.Eventually(t, findStart, 30*time.Second, 100*time.Millisecond, "no session.start of rita's session")
	require.Equal(t, true, start.Fields[events.FieldRecorded], "session.start: %v", start.Fields)
	sid, _ := start.Fields[events.FieldSessionID].(string)
	exported := func() string {
		out, _, err := pctl(t, c.dataDir, "", "recordings", "export", sid)
		if err == nil && strings.Contains(out, "exit-status 0") {
			return out
		}
		return ""
	}
	require.Eventually(t, func() bool { return exported() != "" }, 30*time.Second, 200*time.Millisecond, "the required recording did not reach auth")
	require.Contains(t, exported(), "audited-42")
	verify := mustPctl(t, c.dataDir, "", "recordings", "verify", sid)
	t.Logf("verify: %s", strings.TrimSpace(verify))
}
