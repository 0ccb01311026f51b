package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/service"
)

// TestPctlTokensLsRm: `pctl tokens ls` lists the tokens `tokens add` made
// without printing them whole (unless --with-secrets), and `pctl tokens
// rm` revokes one by the prefix ls shows: the join with it then fails.
func TestPctlTokensLsRm(t *testing.T) {
	c := newAllInOne(t)
	var toks []string
	for _, typ := range []string{"node", "proxy"} {
		m := joinRe.FindStringSubmatch(mustPctl(t, c.dataDir, "", "tokens", "add", "--type", typ))
		require.NotNil(t, m)
		toks = append(toks, m[1])
	}
	out := mustPctl(t, c.dataDir, "", "tokens", "ls")
	for _, tok := range toks {
		require.NotContains(t, out, tok, "a listing prints no whole secret")
		require.Contains(t, out, tok[:8]+"...")
	}
	require.Regexp(t, `(?m)^`+toks[0][:8]+`\.\.\. +node +\S+`, out)
	require.Regexp(t, `(?m)^`+toks[1][:8]+`\.\.\. +proxy +\S+`, out)
	out = mustPctl(t, c.dataDir, "", "tokens", "ls", "--with-secrets")
	require.Contains(t, out, toks[0])

	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(mustPctl(t, c.dataDir, "", "tokens", "ls", "--format", "json")), &listed))
	require.Len(t, listed, 2)
	for _, l := range listed {
		require.NotContains(t, l, "token", "JSON carries no secret either")
		require.Contains(t, []string{toks[0][:8], toks[1][:8]}, l["prefix"])
	}

	_, errOut, err := pctl(t, c.dataDir, "", "tokens", "rm", toks[0][:3])
	require.Error(t, err)
	require.Contains(t, errOut, "too short")
	_, errOut, err = pctl(t, c.dataDir, "", "tokens", "rm", "ffffffffffff")
	require.Error(t, err)
	require.Contains(t, errOut, "no join token")
	out = mustPctl(t, c.dataDir, "", "tokens", "rm", toks[0][:8]+"...")
	require.Contains(t, out, "removed")
	out = mustPctl(t, c.dataDir, "", "tokens", "ls")
	require.NotContains(t, out, toks[0][:8])
	require.Contains(t, out, toks[1][:8])
	mustPctl(t, c.dataDir, "", "tokens", "rm", toks[1])
	require.Contains(t, mustPctl(t, c.dataDir, "", "tokens", "ls"), "No join tokens.")
	require.Equal(t, "[]\n", mustPctl(t, c.dataDir, "", "tokens", "ls", "--format", "json"))

	// The revoked token joins nothing.
	status, msg, _ := rawJoin(t, c.p.Addr(service.ListenerAuth).String(), joinRequest{Token: toks[0], Role: "node", Hostname: "late"})
	require.Equal(t, http.StatusForbidden, status, msg)
	require.Contains(t, msg, "join token not found")
}

// TestPctlUsersUpdateAndResetPassword: update changes roles and logins of
// an existing user (an unknown user or role is a clear error); a reset
// password works at once, the old one no longer does, and the browser
// session opened before the reset is ended.
func TestPctlUsersUpdateAndResetPassword(t *testing.T) {
	c := newAllInOne(t)
	role := filepath.Join(t.TempDir(), "role.yaml")
	require.NoError(t, os.WriteFile(role, []byte("kind: role\nmetadata: {name: dev}\nspec:\n  logins: [x]\n  node_labels: {env: it}\n"), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", role)

	mustPctl(t, c.dataDir, "bob's password\n", "users", "add", "bob", "--logins", "bob")
	out := mustPctl(t, c.dataDir, "", "users", "update", "bob", "--roles", "dev,access", "--logins", "bob,deploy")
	require.Contains(t, out, `User "bob" updated`)
	var users []struct {
		Name   string              `json:"name"`
		Roles  []string            `json:"roles"`
		Traits map[string][]string `json:"traits"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustPctl(t, c.dataDir, "", "users", "ls", "--format", "json")), &users))
	i := slices.IndexFunc(users, func(u struct {
		Name   string              `json:"name"`
		Roles  []string            `json:"roles"`
		Traits map[string][]string `json:"traits"`
	}) bool {
		return u.Name == "bob"
	})
	require.GreaterOrEqual(t, i, 0)
	require.Equal(t, []string{"dev", "access"}, users[i].Roles)
	require.Equal(t, []string{"bob", "deploy"}, users[i].Traits["logins"])
	// Only --logins: the roles stay.
	mustPctl(t, c.dataDir, "", "users", "update", "bob", "--logins", "bob")
	require.Regexp(t, `(?m)^bob +dev,access +bob +- +local$`, mustPctl(t, c.dataDir, "", "users", "ls"))

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"users", "update", "nobody", "--roles", "access"}, `user "nobody" not found`},
		{[]string{"users", "update", "bob", "--roles", "nosuch"}, `role "nosuch" does not exist`},
		{[]string{"users", "update", "bob"}, "nothing to change"},
		{[]string{"users", "update", "bob", "--roles", ""}, "--roles is empty"},
	} {
		_, errOut, err := pctl(t, c.dataDir, "", bad.args...)
		require.Error(t, err, bad.args)
		require.Contains(t, errOut, bad.want, bad.args)
	}

	// alice has a browser session; her password is reset.
	login := webTermLogin(t, c)
	webAddr := c.p.Addr(service.ListenerWeb).String()
	code, body := webNodes(t, login.hc, webAddr, login.cookie, login.token)
	require.Equal(t, http.StatusOK, code, body)
	_, errOut, err := pctl(t, c.dataDir, "short\n", "users", "reset-password", "alice")
	require.Error(t, err)
	require.Contains(t, errOut, "too short")
	_, errOut, err = pctl(t, c.dataDir, "a new long password\n", "users", "reset-password", "nobody")
	require.Error(t, err)
	require.Contains(t, errOut, `user "nobody" not found`)
	out = mustPctl(t, c.dataDir, "a new long password\n", "users", "reset-password", "alice")
	require.Contains(t, out, "1 web session(s) ended")
	require.Eventually(t, func() bool {
		code, _ := webNodes(t, login.hc, webAddr, login.cookie, login.token)
		return code == http.StatusUnauthorized
	}, 10*time.Second, 50*time.Millisecond, "the session opened with the old password ends")
	post := func(password string) int {
		resp, err := login.hc.Post("https://"+webAddr+"/webapi/sessions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"user":"alice","password":%q,"otp_token":""}`, password)))
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.NotEqual(t, http.StatusOK, post(alicePassword), "the old password is refused")
	require.Equal(t, http.StatusOK, post("a new long password"))
}

// TestPctlRmRole: a role is removed by `pctl rm role/NAME` only when
// nobody relies on it: not a preset, not while users hold it (they are
// named), not while a trusted_cluster maps to it.
func TestPctlRmRole(t *testing.T) {
	c := newAllInOne(t)
	role := filepath.Join(t.TempDir(), "role.yaml")
	require.NoError(t, os.WriteFile(role, []byte("kind: role\nmetadata: {name: dev}\nspec:\n  logins: [x]\n  node_labels: {env: it}\n"), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", role)
	mustPctl(t, c.dataDir, "carol's password\n", "users", "add", "carol", "--logins", "carol", "--roles", "dev")
	mustPctl(t, c.dataDir, "dave's password\n", "users", "add", "dave", "--logins", "dave", "--roles", "access,dev")

	for _, preset := range []string{"access", "admin"} {
		_, errOut, err := pctl(t, c.dataDir, "", "rm", "role/"+preset)
		require.Error(t, err)
		require.Contains(t, errOut, "preset role")
	}
	_, errOut, err := pctl(t, c.dataDir, "", "rm", "role/dev")
	require.Error(t, err)
	require.Contains(t, errOut, `still assigned to 2 user(s): "carol", "dave"`)
	require.Contains(t, mustPctl(t, c.dataDir, "", "roles", "ls"), "dev ")

	mustPctl(t, c.dataDir, "", "users", "update", "carol", "--roles", "access")
	mustPctl(t, c.dataDir, "", "users", "rm", "dave")
	require.Contains(t, mustPctl(t, c.dataDir, "", "rm", "role/dev"), `role "dev" removed`)
	require.NotContains(t, mustPctl(t, c.dataDir, "", "roles", "ls"), "dev ")
	_, errOut, err = pctl(t, c.dataDir, "", "rm", "role/dev")
	require.Error(t, err)
	require.Contains(t, errOut, `role "dev" not found`)
	_, errOut, err = pctl(t, c.dataDir, "", "rm", "user/carol")
	require.Error(t, err)
	require.Contains(t, errOut, `does not remove kind "user"`)
}

// TestPctlEveryListingHasJSON: every listing of pctl (found by walking its
// command tree, so a listing added later is covered) takes --format json
// and prints a JSON array; `pctl get` takes json and yaml.
func TestPctlEveryListingHasJSON(t *testing.T) {
	c := newAllInOne(t)
	mustPctl(t, c.dataDir, "", "lock", "--user", "ghost", "--message", "gone")
	mustPctl(t, c.dataDir, "", "tokens", "add")
	env := os.Environ()
	cmds := listCommands(t, env, "pctl")
	require.GreaterOrEqual(t, len(cmds), 10, "%v", cmds)
	for _, cmd := range cmds {
		if cmd[0] == "get" {
			cmd = []string{"get", "role"}
		}
		args := append(slices.Clone(cmd), "--format", "json")
		out := mustPctl(t, c.dataDir, "", args...)
		if cmd[0] == "events" {
			// One object per line, for streaming into jq.
			for _, line := range strings.FieldsFunc(out, func(r rune) bool { return r == '\n' }) {
				require.True(t, json.Valid([]byte(line)), "pctl %v: %s", args, line)
			}
			continue
		}
		var v []json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(out), &v), "pctl %v prints a JSON array:\n%s", args, out)
	}
	var roles []struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustPctl(t, c.dataDir, "", "get", "role", "access", "--format", "json")), &roles))
	require.Len(t, roles, 1)
	require.Equal(t, "access", roles[0].Metadata.Name)
	require.Contains(t, mustPctl(t, c.dataDir, "", "get", "role", "access", "--format", "yaml"), "name: access")
	_, errOut, err := pctl(t, c.dataDir, "", "users", "ls", "--format", "xml")
	require.Error(t, err)
	require.Contains(t, errOut, "xml")
}
