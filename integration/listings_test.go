package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/etcdbk"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// hostile is the text an attacker plants: a CR and ESC[2K erase the line
// the terminal is on, the LF starts a forged audit line, and the OSC
// sequence retitles the admin's window.
const hostile = "\r\x1b[2Kauth.login admin\n\x1b]0;pwned\x07"

// hostileEscaped is how any listing must show it: the ESC spelled out
// (strconv.Quote in text, \u001b in JSON, \e in YAML).
var hostileEscaped = regexp.MustCompile(`\\x1b\[2K|\\u001b\[2K|\\e\[2K`)

// forgedLine is what a raw LF would leave on a line of its own.
var forgedLine = regexp.MustCompile(`(?m)^\s*"?auth\.login admin`)

// completions returns what kingpin's hidden --completion-bash flag lists
// after args: the subcommands of a command (nothing for a leaf) or, after
// "--", its flags.
func completions(t *testing.T, env []string, binary string, args ...string) []string {
	t.Helper()
	full := append(slices.Clone(args), "--completion-bash")
	if n := len(args); n > 0 && args[n-1] == "--" {
		full = append(slices.Clone(args[:n-1]), "--completion-bash", "--")
	}
	cmd := exec.Command(bin(binary), full...)
	cmd.Env = env
	out, err := cmd.Output()
	require.NoError(t, err, "%s %v --completion-bash", binary, args)
	return strings.Fields(string(out))
}

// listCommands walks binary's whole command tree (the kingpin app itself,
// through its completion) and returns every listing: the leaves named ls,
// and get. A listing added later is found here without anyone editing
// the test.
func listCommands(t *testing.T, env []string, binary string, prefix ...string) [][]string {
	t.Helper()
	var out [][]string
	subs := completions(t, env, binary, prefix...)
	if len(subs) == 0 {
		if last := prefix[len(prefix)-1]; last == "ls" || (binary == "pctl" && last == "get") {
			out = append(out, slices.Clone(prefix))
		}
		return out
	}
	for _, s := range subs {
		if s == "help" || strings.HasPrefix(s, "-") {
			continue
		}
		out = append(out, listCommands(t, env, binary, append(slices.Clone(prefix), s)...)...)
	}
	return out
}

// formatsOf returns the --format values to try on a command: none but
// text when it has no --format flag (a value it does not take is skipped
// on its enum error).
func formatsOf(t *testing.T, env []string, binary string, cmd []string) []string {
	t.Helper()
	if !slices.Contains(completions(t, env, binary, append(slices.Clone(cmd), "--")...), "--format") {
		return []string{"text"}
	}
	return []string{"text", "json", "yaml"}
}

// requireNoRawControls checks that out holds no raw control character.
func requireNoRawControls(t *testing.T, what, out string) {
	t.Helper()
	for _, b := range []byte(out) {
		if (b < 0x20 && b != '\n') || b == 0x7f {
			t.Errorf("%s prints the raw control character %q:\n%s", what, b, out)
			return
		}
	}
}

// requireEscaped checks one listing's output: the hostile text is shown
// (so the field was listed) and only ever escaped.
func requireEscaped(t *testing.T, what, out string) {
	t.Helper()
	requireNoRawControls(t, what, out)
	if t.Failed() {
		return
	}
	require.NotRegexp(t, forgedLine, out, "%s lets a value start a line of its own", what)
	require.Regexp(t, hostileEscaped, out, "%s shows none of the hostile text planted for it: plant some in TestListingsEscapeHostileText", what)
}

// TestListingsEscapeHostileText: every listing of pctl and psh, in every
// format it has, run against a real cluster in which a user, a role, a
// node, a proxy, a leaf cluster, a lock, a token, audit events and a
// recording all carry a CR/ESC/LF/OSC payload, prints it escaped. The
// events and the recording come from the attack itself (an exec command
// and the SSH user name of a failed login); the records are written
// straight into the backend (etcd), as records from before validation
// or from a compromised writer would be.
func TestListingsEscapeHostileText(t *testing.T) {
	etcd := etcdtest.Start(t)
	const prefix = "/listings"
	c := newAllInOneWith(t, func(cfg *config.Config) {
		cfg.Backend = config.BackendConfig{Type: config.BackendEtcd, EtcdEndpoints: etcd.Endpoints, EtcdPrefix: prefix}
	})
	ctx := context.Background()
	b, err := etcdbk.New(ctx, etcdbk.Config{Endpoints: etcd.Endpoints, Prefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })

	putJSON := func(key string, v any, expires time.Time) {
		data, err := json.Marshal(v)
		require.NoError(t, err)
		_, err = b.Put(ctx, backend.Item{Key: key, Value: data, Expires: expires})
		require.NoError(t, err)
	}
	// rewrite changes a stored record as JSON, bypassing validation.
	rewrite := func(key string, mutate func(m map[string]any)) {
		item, err := b.Get(ctx, key)
		require.NoError(t, err, key)
		var m map[string]any
		require.NoError(t, json.Unmarshal(item.Value, &m))
		mutate(m)
		putJSON(key, m, item.Expires)
	}
	soon := time.Now().Add(time.Hour)

	// Users and roles.
	mustPctl(t, c.dataDir, "mallory's password\n", "users", "add", "mallory", "--logins", "mallory")
	rewrite(backend.Key("users", "mallory"), func(m map[string]any) {
		m["name"] = "mallory" + hostile
		m["traits"] = map[string][]string{"logins": {"mallory", hostile}}
	})
	rolePath := filepath.Join(t.TempDir(), "role.yaml")
	require.NoError(t, os.WriteFile(rolePath, []byte("kind: role\nmetadata: {name: shady}\nspec:\n  logins: [x]\n  node_labels: {env: x}\n"), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", rolePath)
	rewrite(backend.Key("roles", "shady"), func(m map[string]any) {
		spec := m["spec"].(map[string]any)
		spec["logins"] = []string{"x", hostile}
		spec["node_labels"] = map[string][]string{hostile: {hostile}}
	})
	// A node and a proxy, as heartbeats.
	nodeID := uuid.NewString()
	putJSON(services.NodeKey(clusterName, nodeID), services.Node{
		UUID: nodeID, Hostname: "evil" + hostile, Addr: "127.0.0.1:1", Cluster: clusterName,
		Labels: map[string]string{"env": "it", "x" + hostile: hostile}, LastHeartbeat: time.Now(), Expires: soon,
	}, soon)
	proxyID := uuid.NewString()
	putJSON(services.ProxyKey(clusterName, proxyID), services.Proxy{
		UUID: proxyID, Hostname: "evilproxy" + hostile, Cluster: clusterName, SSHAddr: "127.0.0.1:1",
		Version: hostile, LastHeartbeat: time.Now(), Expires: soon,
	}, soon)
	// A leaf cluster, a lock and a join token.
	putJSON(backend.Key("remote_clusters", "leafy"), services.RemoteCluster{Name: "leafy" + hostile, Created: time.Now(), StatusNow: hostile}, time.Time{})
	mustPctl(t, c.dataDir, "", "lock", "--user", "ghost", "--message", "gone")
	locks, err := b.GetRange(ctx, services.LocksPrefix(), 0)
	require.NoError(t, err)
	require.Len(t, locks, 1)
	rewrite(locks[0].Key, func(m map[string]any) {
		m["message"] = hostile
		m["created_by"] = hostile
	})
	mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node")
	tokens, err := b.GetRange(ctx, backend.Prefix("tokens"), 0)
	require.NoError(t, err)
	require.NotEmpty(t, tokens)
	rewrite(tokens[0].Key, func(m map[string]any) { m["type"] = hostile })

	// An access request of alice's, whose reason and roles carry it
	// (psh request ls shows her own, pctl requests ls every one).
	reqID := uuid.NewString()
	putJSON(services.AccessRequestKey(reqID), services.AccessRequest{
		ID: reqID, User: "alice", Roles: []string{"dba" + hostile}, Reason: hostile, State: "pending",
		Thresholds: 1, Created: time.Now(), Expires: soon,
	}, soon)

	// The attack itself: alice runs a command that is the payload (the
	// session's events and its recording carry it), and someone tries
	// to log in to the proxy as the payload (auth.failed carries it).
	clt, err := c.viaJump(t, c.hostname+":0")
	require.NoError(t, err)
	s, err := clt.NewSession()
	require.NoError(t, err)
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	hostileCmd := "printf %s '" + hostile + "'"
	_ = s.Run(hostileCmd)
	s.Close()
	clt.Close()
	bad := c.clientConfig(t)
	bad.User = "x" + hostile
	_, err = ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), bad)
	require.Error(t, err)
	require.Eventually(t, func() bool {
		ended, failed, sid := false, false, ""
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.SessionStart && e.Fields[events.FieldCommand] == hostileCmd {
				sid, _ = e.Fields[events.FieldSessionID].(string)
			}
			ended = ended || (e.Type == events.SessionEnd && sid != "" && e.Fields[events.FieldSessionID] == sid)
			for _, v := range e.Fields {
				failed = failed || (e.Type != events.SessionStart && e.Type != events.SessionEnd && strings.Contains(fmt.Sprint(v), hostile))
			}
		}
		recs, _, _ := pctl(t, c.dataDir, "", "recordings", "ls")
		return ended && failed && strings.Contains(recs, "printf")
	}, 20*time.Second, 100*time.Millisecond, "the hostile session and the failed login are audited and recorded")

	alice := newPshEnv(t, c)
	alice.login(t, "alice", alicePassword+"\n")

	pctlEnv := os.Environ()
	runs := 0
	for _, binary := range []string{"pctl", "psh"} {
		env := pctlEnv
		if binary == "psh" {
			env = alice.env()
		}
		cmds := listCommands(t, env, binary)
		require.NotEmpty(t, cmds, binary)
		for _, cmd := range cmds {
			var variants [][]string
			if binary == "pctl" && cmd[0] == "get" {
				for _, kind := range []string{"role", "user", "node", "lock", "trusted_cluster"} {
					variants = append(variants, []string{"get", kind})
				}
			} else {
				variants = [][]string{cmd}
			}
			for _, v := range variants {
				for _, format := range formatsOf(t, env, binary, cmd) {
					args := v
					if format != "text" {
						args = append(slices.Clone(v), "--format", format)
					}
					what := binary + " " + strings.Join(args, " ")
					var out, errOut string
					failed := false
					if binary == "pctl" {
						var err error
						out, errOut, err = pctl(t, c.dataDir, "", args...)
						failed = err != nil
					} else {
						var code int
						out, errOut, code = alice.run(t, "", args...)
						failed = code != 0
					}
					if failed && strings.Contains(errOut, "enum value must be one of") {
						continue // not a format of this command
					}
					require.False(t, failed, "%s: %s", what, errOut)
					if v[0] == "get" && v[1] == "trusted_cluster" {
						// This root trusts nobody: nothing to show,
						// nothing to escape (JSON: an empty array).
						require.Contains(t, []string{"", "[]"}, strings.TrimSpace(out), what)
						continue
					}
					if binary == "psh" && v[0] == "sessions" {
						// Nobody shares a live session with alice here:
						// an empty list has nothing to escape. (Its rows
						// go through the same escaping table and JSON
						// writer as every listing.)
						requireNoRawControls(t, what, out)
						continue
					}
					requireEscaped(t, what, out)
					runs++
				}
			}
		}
	}
	require.GreaterOrEqual(t, runs, 12, "every listing was run")
}
