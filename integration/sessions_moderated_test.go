package integration

import (
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/service"
)

// TestPshModeratedSession: through the built binaries, a user whose role
// requires a moderator gets "waiting for a moderator"; what they type
// then is dropped; an observer does not start the session; a moderator
// joining with psh does, and the owner's shell runs from then on.
func TestPshModeratedSession(t *testing.T) {
	c := newAllInOne(t)
	createRole(t, c.dataDir, "kind: role\nmetadata: {name: held}\nspec:\n  require_session_join: [{roles: [auditor], modes: [moderator], count: 1, on_leave: pause}]\n")
	createRole(t, c.dataDir, "kind: role\nmetadata: {name: auditor}\nspec:\n  join_sessions: [{roles: [held], modes: [observer, moderator]}]\n")
	mustPctl(t, c.dataDir, "password-hank\n", "users", "add", "hank", "--logins", c.login, "--roles", "access,held")
	mustPctl(t, c.dataDir, "password-olga\n", "users", "add", "olga", "--logins", c.login, "--roles", "access,auditor")
	hank := newPshEnv(t, c)
	hank.login(t, "hank", "password-hank\n")
	olga := newPshEnv(t, c)
	olga.login(t, "olga", "password-olga\n")

	ownerPty, ownerOut, _ := hank.onPty(t, "ssh", "node-1")
	waitOutput(t, ownerOut, "waiting for a moderator")
	idRE := regexp.MustCompile(`--mode moderator ([0-9a-f-]{36})\)`)
	require.Eventually(t, func() bool { return idRE.MatchString(ownerOut()) }, 30*time.Second, 20*time.Millisecond)
	id := idRE.FindStringSubmatch(ownerOut())[1]
	_, err := io.WriteString(ownerPty, "echo early-$((1+1))\r")
	require.NoError(t, err)

	obsPty, obsOut, obsDone := olga.onPty(t, "join", id)
	waitOutput(t, ownerOut, "[postern: olga joined as observer]")
	require.NotContains(t, ownerOut(), "the session starts")
	_, err = obsPty.Write([]byte{0x1d, '.'})
	require.NoError(t, err)
	<-obsDone
	_ = obsOut

	_, modOut, _ := olga.onPty(t, "join", "--mode", "moderator", id)
	waitOutput(t, ownerOut, "a moderator is present; the session starts")
	_, err = io.WriteString(ownerPty, "echo started-$((2+2))\r")
	require.NoError(t, err)
	waitOutput(t, ownerOut, "started-4")
	waitOutput(t, modOut, "started-4")
	require.NotContains(t, ownerOut(), "early-2", "typed while waiting: dropped")
}

// TestPshJoinThroughSecondProxyToTunnelNode: a session on a node that is
// reached only through its reverse tunnel is listed and joined by a user
// logged in at a second proxy: the join is routed like any dial.
func TestPshJoinThroughSecondProxyToTunnelNode(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	pb, pbCfg := startRemoteProxy(t, c.dataDir, c.p, "edge-b")
	waitProxies(t, clt, 2)
	startNATNode(t, c, "nat-1")
	waitNodes(t, clt, 2)
	createRole(t, c.dataDir, "kind: role\nmetadata: {name: auditor}\nspec:\n  join_sessions: [{roles: [access], modes: [observer]}]\n")
	mustPctl(t, c.dataDir, "password-olga\n", "users", "add", "olga", "--logins", c.login, "--roles", "access,auditor")

	alice := newPshEnv(t, c)
	alice.login(t, "alice", alicePassword+"\n")
	olga := newPshEnv(t, c)
	olga.mustRun(t, "password-olga\n", "login", "--proxy", pb.Addr(service.ListenerWeb).String(), "--user", "olga",
		"--cacert", filepath.Join(pbCfg.DataDir, "web", "web.crt"))

	ownerPty, ownerOut, _ := alice.onPty(t, "ssh", "nat-1")
	_, err := io.WriteString(ownerPty, "echo id$((1+1))=$SSH_SESSION_ID.\r")
	require.NoError(t, err)
	idRE := regexp.MustCompile(`id2=([0-9a-f-]{36})\.`)
	require.Eventually(t, func() bool { return idRE.MatchString(ownerOut()) }, 30*time.Second, 20*time.Millisecond)
	id := idRE.FindStringSubmatch(ownerOut())[1]

	list := olga.mustRun(t, "", "sessions", "ls")
	require.Contains(t, list, id)
	require.Regexp(t, regexp.MustCompile(regexp.QuoteMeta(id)+`\s+alice\s+\S+\s+nat-1\s`), list)

	_, obsOut, _ := olga.onPty(t, "join", id)
	waitOutput(t, obsOut, "id2="+id)
	_, err = io.WriteString(ownerPty, "echo via-tunnel-$((6*7))\r")
	require.NoError(t, err)
	waitOutput(t, obsOut, "via-tunnel-42")
	require.True(t, strings.Contains(ownerOut(), "[postern: olga joined as observer]"))
}
