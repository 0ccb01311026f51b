package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pshOnPty starts psh args on a pty with e's home and returns the pty,
// what psh printed so far, and a channel closed when psh's side ended.
func (e *pshEnv) onPty(t *testing.T, args ...string) (*os.File, func() string, <-chan struct{}) {
	t.Helper()
	cmd := e.cmd("", args...)
	cmd.Stdin = nil
	ptmx, out, done := startOnPty(t, cmd, 24, 80)
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return ptmx, out, done
}

func waitOutput(t *testing.T, out func() string, want string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(out(), want) }, 30*time.Second, 20*time.Millisecond, "waiting for %q in %q", want, func() string { return out() })
}

// TestPshJoinSession: through the built binaries, a user whose role has
// join_sessions lists alice's live psh ssh session and joins it: as an
// observer (sees the screen and the output live, cannot type), as a peer
// (types into it), as a moderator (ends it for everyone with Ctrl-] t).
// A user without the right neither sees nor joins it: not found.
func TestPshJoinSession(t *testing.T) {
	c := newAllInOne(t)
	createRole(t, c.dataDir, "kind: role\nmetadata: {name: auditor}\nspec:\n  join_sessions: [{roles: [access], modes: [observer, peer, moderator]}]\n")
	mustPctl(t, c.dataDir, "password-olga\n", "users", "add", "olga", "--logins", c.login, "--roles", "access,auditor")
	mustPctl(t, c.dataDir, "password-carl\n", "users", "add", "carl", "--logins", c.login, "--roles", "access")

	alice := newPshEnv(t, c)
	alice.login(t, "alice", alicePassword+"\n")
	olga := newPshEnv(t, c)
	olga.login(t, "olga", "password-olga\n")
	carl := newPshEnv(t, c)
	carl.login(t, "carl", "password-carl\n")

	ownerPty, ownerOut, ownerDone := alice.onPty(t, "ssh", "node-1")
	_, err := io.WriteString(ownerPty, "echo id$((1+1))=$SSH_SESSION_ID.\r")
	require.NoError(t, err)
	idRE := regexp.MustCompile(`id2=([0-9a-f-]{36})\.`)
	require.Eventually(t, func() bool { return idRE.MatchString(ownerOut()) }, 30*time.Second, 20*time.Millisecond, "owner: %q", func() string { return ownerOut() })
	id := idRE.FindStringSubmatch(ownerOut())[1]

	t.Run("list", func(t *testing.T) {
		out := olga.mustRun(t, "", "sessions", "ls", "--format", "json")
		var list []map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &list), out)
		require.Len(t, list, 1, out)
		require.Equal(t, id, list[0]["id"])
		require.Equal(t, "alice", list[0]["user"])
		require.Equal(t, "node-1", list[0]["node"])
		text := olga.mustRun(t, "", "sessions", "ls")
		require.Regexp(t, `(?m)^ID\s+USER\s+LOGIN\s+NODE\s+STARTED\s+PARTICIPANTS`, text)
		require.Contains(t, text, id)
	})

	t.Run("no right: not listed, not found", func(t *testing.T) {
		out := carl.mustRun(t, "", "sessions", "ls", "--format", "json")
		require.Equal(t, "[]", strings.TrimSpace(out))
		_, errOut, code := carl.run(t, "", "join", id)
		require.Equal(t, 1, code)
		requireOneLineError(t, errOut, "session "+id+" not found")
		_, errOut, code = carl.run(t, "", "join", "not-a-session")
		require.Equal(t, 1, code)
		requireOneLineError(t, errOut, `malformed session id "not-a-session"`)
	})

	t.Run("observer", func(t *testing.T) {
		obsPty, obsOut, obsDone := olga.onPty(t, "join", id)
		waitOutput(t, obsOut, "id2="+id) // the screen as it was
		waitOutput(t, ownerOut, "[postern: olga joined as observer]")
		_, err := io.WriteString(ownerPty, "echo owner-$((6*7))\r")
		require.NoError(t, err)
		waitOutput(t, obsOut, "owner-42")
		_, err = io.WriteString(obsPty, "echo observer-$((3*3))\r")
		require.NoError(t, err)
		waitOutput(t, obsOut, "what you type is not sent")
		_, err = io.WriteString(ownerPty, "echo sync-$((1+2))\r")
		require.NoError(t, err)
		waitOutput(t, ownerOut, "sync-3")
		require.NotContains(t, ownerOut(), "observer-9")
		_, err = obsPty.Write([]byte{0x1d, '.'})
		require.NoError(t, err)
		<-obsDone
		waitOutput(t, ownerOut, "[postern: olga (observer) left]")
	})

	t.Run("peer", func(t *testing.T) {
		peerPty, peerOut, peerDone := olga.onPty(t, "join", "--mode", "peer", id)
		waitOutput(t, peerOut, "sync-3")
		_, err := io.WriteString(peerPty, "echo peer-$((5*5))\r")
		require.NoError(t, err)
		waitOutput(t, ownerOut, "peer-25")
		_, err = peerPty.Write([]byte{0x1d, 't'}) // refused: not a moderator
		require.NoError(t, err)
		_, err = peerPty.Write([]byte{0x1d, '.'})
		require.NoError(t, err)
		<-peerDone
	})

	t.Run("moderator ends it", func(t *testing.T) {
		modPty, modOut, modDone := olga.onPty(t, "join", "--mode", "moderator", id)
		waitOutput(t, modOut, "peer-25")
		_, err := modPty.Write([]byte{0x1d, 't'})
		require.NoError(t, err)
		waitOutput(t, ownerOut, "[postern: olga (moderator) ended the session]")
		select {
		case <-ownerDone:
		case <-time.After(30 * time.Second):
			t.Fatalf("the owner's psh did not end: %q", ownerOut())
		}
		select {
		case <-modDone:
		case <-time.After(30 * time.Second):
			t.Fatalf("the moderator's psh did not end: %q", modOut())
		}
	})
}

// TestWebActiveSessions: GET /webapi/sessions/active lists alice's live
// session to a browser user whose role may join it, and nothing to one
// whose role may not.
func TestWebActiveSessions(t *testing.T) {
	c := newAllInOne(t)
	createRole(t, c.dataDir, "kind: role\nmetadata: {name: auditor}\nspec:\n  join_sessions: [{roles: [access], modes: [observer]}]\n")
	mustPctl(t, c.dataDir, "password-olga\n", "users", "add", "olga", "--logins", c.login, "--roles", "access,auditor")
	mustPctl(t, c.dataDir, "password-carl\n", "users", "add", "carl", "--logins", c.login, "--roles", "access")
	alice := newPshEnv(t, c)
	alice.login(t, "alice", alicePassword+"\n")
	ownerPty, ownerOut, _ := alice.onPty(t, "ssh", "node-1")
	_, err := io.WriteString(ownerPty, "echo id$((1+1))=$SSH_SESSION_ID.\r")
	require.NoError(t, err)
	idRE := regexp.MustCompile(`id2=([0-9a-f-]{36})\.`)
	require.Eventually(t, func() bool { return idRE.MatchString(ownerOut()) }, 30*time.Second, 20*time.Millisecond)
	id := idRE.FindStringSubmatch(ownerOut())[1]

	base := webTermLogin(t, c)
	as := func(user, password string) []map[string]any {
		cookie, token := webLogin(t, base.hc, base.addr, user, password)
		code, body := webGet(t, &webTermClient{addr: base.addr, hc: base.hc, cookie: cookie, token: token}, "/webapi/sessions/active")
		require.Equal(t, http.StatusOK, code, string(body))
		var resp struct {
			Items []map[string]any `json:"items"`
		}
		require.NoError(t, json.Unmarshal(body, &resp), string(body))
		return resp.Items
	}
	items := as("olga", "password-olga")
	require.Len(t, items, 1)
	require.Equal(t, id, items[0]["id"])
	require.Equal(t, "alice", items[0]["user"])
	require.Equal(t, "node-1", items[0]["node"])
	require.Equal(t, c.p.HostUUID(), items[0]["node_uuid"])
	require.Empty(t, as("carl", "password-carl"), "a user who may not join sees nothing")
}
