package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// requestRoles: requester reaches nothing but may request it-access (the
// all-in-one's node, env=it); needs2 may request it with two approvals;
// reviewer reviews it-access requests; stranger reviews another role.
const requestRoles = `kind: role
metadata: {name: it-access}
spec:
  logins: ['{{internal.logins}}']
  node_labels: {env: it}
---
kind: role
metadata: {name: requester}
spec:
  logins: ['{{internal.logins}}']
  node_labels: {env: nowhere}
  request: {roles: [it-access], max_ttl: 1h}
---
kind: role
metadata: {name: needs2}
spec:
  logins: ['{{internal.logins}}']
  node_labels: {env: nowhere}
  request: {roles: [it-access], thresholds: 2}
---
kind: role
metadata: {name: reviewer}
spec:
  logins: ['{{internal.logins}}']
  node_labels: {env: nowhere}
  review_requests: {roles: [it-access]}
---
kind: role
metadata: {name: stranger}
spec:
  logins: ['{{internal.logins}}']
  node_labels: {env: nowhere}
  review_requests: {roles: [other]}
`

// requestsCluster is an all-in-one with the roles above and a psh home
// per user (each logged in with a password).
type requestsCluster struct {
	c     *allInOne
	users map[string]*pshEnv
}

func newRequestsCluster(t *testing.T) *requestsCluster {
	t.Helper()
	c := newAllInOne(t)
	dir := t.TempDir()
	for i, doc := range strings.Split(requestRoles, "---\n") {
		f := filepath.Join(dir, "role"+string(rune('a'+i))+".yaml")
		require.NoError(t, os.WriteFile(f, []byte(doc), 0o600))
		mustPctl(t, c.dataDir, "", "create", "-f", f)
	}
	rc := &requestsCluster{c: c, users: map[string]*pshEnv{}}
	for name, role := range map[string]string{"rita": "requester", "otto": "needs2", "rev1": "reviewer", "rev2": "reviewer", "sam": "stranger"} {
		mustPctl(t, c.dataDir, "pw-"+name+"-long-enough\n", "users", "add", name, "--logins", c.login, "--roles", role)
		e := newPshEnv(t, c)
		e.login(t, name, "pw-"+name+"-long-enough\n")
		rc.users[name] = e
	}
	return rc
}

// bgSSH is a psh ssh running a long command; ended is closed when psh
// exits.
type bgSSH struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	ended  chan struct{}
}

func startBgSSH(t *testing.T, e *pshEnv, host string) *bgSSH {
	t.Helper()
	b := &bgSSH{cmd: e.cmd("", "ssh", host, "echo started; sleep 600"), ended: make(chan struct{})}
	out, err := b.cmd.StdoutPipe()
	require.NoError(t, err)
	b.cmd.Stderr = &b.stderr
	require.NoError(t, b.cmd.Start())
	first := make([]byte, 8)
	_, err = out.Read(first)
	require.NoError(t, err, "the session did not start")
	require.Equal(t, "started\n", string(first))
	go func() {
		_, _ = bytes.NewBuffer(nil).ReadFrom(out)
		_ = b.cmd.Wait()
		close(b.ended)
	}()
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
		<-b.ended
	})
	return b
}

func (b *bgSSH) requireEnded(t *testing.T, within time.Duration, what string) string {
	t.Helper()
	select {
	case <-b.ended:
	case <-time.After(within):
		t.Fatalf("%s: the open session was not ended within %v", what, within)
	}
	return b.stderr.String()
}

// TestAccessRequests: through the built psh and pctl, a user who cannot
// reach a node requests a role, is approved, reaches it; a deny and an
// expiry end the open session; thresholds, self-approval, reviewers
// without review_requests, forged and foreign request ids and roles not
// requestable are refused.
func TestAccessRequests(t *testing.T) {
	rc := newRequestsCluster(t)
	c := rc.c
	rita, rev1, rev2, sam, otto := rc.users["rita"], rc.users["rev1"], rc.users["rev2"], rc.users["sam"], rc.users["otto"]

	// Denied before any request.
	_, errOut, code := rita.run(t, "", "ssh", "node-1", "true")
	require.Equal(t, 255, code, errOut)
	requireOneLineError(t, errOut, `node "node-1" not found`)

	// A role the request option does not name.
	_, errOut, code = rita.run(t, "", "request", "create", "--roles", "admin")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "do not allow requesting role(s) admin")

	id := strings.TrimSpace(rita.mustRun(t, "", "request", "create", "--roles", "it-access", "--reason", "incident 42", "--ttl", "30m"))
	require.NoError(t, uuid.Validate(id), id)

	// Not approved yet: no certificate.
	_, errOut, code = rita.run(t, "", "login", "--request-id", id)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "not approved")
	// Self-approval, a reviewer without review_requests for the role.
	_, errOut, code = rita.run(t, "", "request", "approve", id)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "your own")
	_, errOut, code = sam.run(t, "", "request", "approve", id)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "not found")
	require.NotContains(t, sam.mustRun(t, "", "request", "ls"), id, "a reviewer sees only what they may review")
	require.Contains(t, rev1.mustRun(t, "", "request", "ls"), id)

	require.Contains(t, rev1.mustRun(t, "", "request", "approve", "--reason", "go ahead", id), "approved")
	// Another user's request id, a forged one.
	_, errOut, code = otto.run(t, "", "login", "--request-id", id)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "not an approved request of yours")
	_, errOut, code = rita.run(t, "", "login", "--request-id", uuid.NewString())
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "not an approved request of yours")

	// pctl route --user names the request that grants the access.
	route := mustPctl(t, c.dataDir, "", "route", "--user", "rita", "node-1")
	require.Contains(t, route, "request:    "+id)
	require.Contains(t, route, "grants node-1")

	_, errOut, code = rita.run(t, "", "login", "--request-id", id)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "Logged in with access request "+id)
	require.Equal(t, "ok\n", rita.mustRun(t, "", "ssh", "node-1", "echo ok"))

	// A deny of the approved request ends the open session.
	sess := startBgSSH(t, rita, "node-1")
	require.Contains(t, rev2.mustRun(t, "", "request", "deny", "--reason", "incident over", id), "denied")
	stderr := sess.requireEnded(t, lockWait, "deny")
	require.Contains(t, stderr, "access request "+id)
	require.Contains(t, mustPctl(t, c.dataDir, "", "requests", "show", id), "denied")

	// Expiry ends an open session: a short grant.
	rita.login(t, "rita", "pw-rita-long-enough\n")
	short := strings.TrimSpace(rita.mustRun(t, "", "request", "create", "--roles", "it-access", "--ttl", "6s"))
	mustPctl(t, c.dataDir, "", "requests", "approve", short)
	rita.mustRun(t, "", "login", "--request-id", short)
	sess = startBgSSH(t, rita, "node-1")
	stderr = sess.requireEnded(t, 6*time.Second+lockWait, "expiry")
	require.Contains(t, stderr, "access request "+short)
	require.Contains(t, mustPctl(t, c.dataDir, "", "requests", "show", short), "expired")

	// Thresholds of 2: one approval is not enough.
	two := strings.TrimSpace(otto.mustRun(t, "", "request", "create", "--roles", "it-access"))
	require.Contains(t, rev1.mustRun(t, "", "request", "approve", two), "pending")
	_, errOut, code = otto.run(t, "", "login", "--request-id", two)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, rev2.mustRun(t, "", "request", "approve", two), "approved")
	otto.mustRun(t, "", "login", "--request-id", two)
	require.Equal(t, "ok\n", otto.mustRun(t, "", "ssh", "node-1", "echo ok"))

	// --wait: psh blocks until the review, then logs in with the grant.
	rita.login(t, "rita", "pw-rita-long-enough\n")
	wait := rita.cmd("", "request", "create", "--roles", "it-access", "--wait", "--wait-timeout", "1m")
	var waitOut, waitErr bytes.Buffer
	wait.Stdout, wait.Stderr = &waitOut, &waitErr
	require.NoError(t, wait.Start())
	waited := make(chan error, 1)
	go func() { waited <- wait.Wait() }()
	var waitID string
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(mustPctl(t, c.dataDir, "", "requests", "ls"), "\n") {
			if strings.Contains(line, "rita") && strings.Contains(line, "pending") {
				waitID = strings.Fields(line)[0]
				return true
			}
		}
		return false
	}, 20*time.Second, 100*time.Millisecond)
	select {
	case err := <-waited:
		t.Fatalf("psh --wait returned before the review: %v %s", err, waitErr.String())
	default:
	}
	rev1.mustRun(t, "", "request", "approve", waitID)
	select {
	case err := <-waited:
		require.NoError(t, err, waitErr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("psh --wait did not return after the approval")
	}
	require.Equal(t, waitID+"\n", waitOut.String())
	require.Contains(t, waitErr.String(), "Logged in with access request "+waitID)
	require.Equal(t, "ok\n", rita.mustRun(t, "", "ssh", "node-1", "echo ok"))

	// With ssh-agent, the key is added with the new certificate too.
	t.Run("ssh-agent", func(t *testing.T) {
		requireOpenSSH(t, "ssh-agent", "ssh-add")
		ae := &pshEnv{c: c, home: rita.home, agentSock: startAgent(t)}
		ae.login(t, "rita", "pw-rita-long-enough\n")
		id := strings.TrimSpace(ae.mustRun(t, "", "request", "create", "--roles", "it-access"))
		mustPctl(t, c.dataDir, "", "requests", "approve", id)
		_, errOut, code := ae.run(t, "", "login", "--request-id", id)
		require.Equal(t, 0, code, errOut)
		require.NotContains(t, errOut, "WARNING")
		list := exec.Command("ssh-add", "-l")
		list.Env = ae.env()
		out, err := list.CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, 2, strings.Count(string(out), "ED25519-CERT"), string(out))
	})

	// Every step is audited.
	events := mustPctl(t, c.dataDir, "", "events", "ls", "--format", "json")
	for _, typ := range []string{"access_request.create", "access_request.review", "access_request.expire"} {
		require.Contains(t, events, typ)
	}
}
