package integration

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

const clusterName = "it"

// testOptions keeps password hashing cheap: a default-cost bcrypt hash
// takes seconds under the race detector.
func testOptions() service.Options {
	return service.Options{BcryptCost: bcrypt.MinCost}
}

// procConfig is a config whose every listener binds 127.0.0.1:0.
func procConfig(dataDir string, roles ...string) *config.Config {
	return &config.Config{FileConfig: config.FileConfig{
		DataDir:     dataDir,
		Roles:       roles,
		ClusterName: clusterName,
		NodeAddr:    "127.0.0.1:0",
		SSHAddr:     "127.0.0.1:0",
		WebAddr:     "127.0.0.1:0",
		TunnelAddr:  "127.0.0.1:0",
		PeerAddr:    "127.0.0.1:0",
		AuthAddr:    "127.0.0.1:0",
		DiagAddr:    "127.0.0.1:0",
	}}
}

// startProcess starts a process and stops it at the end of the test.
func startProcess(t testing.TB, cfg *config.Config) *service.Process {
	t.Helper()
	p, err := service.New(cfg, testOptions())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		stopProcess(t, p)
		require.NoError(t, err)
	}
	t.Cleanup(func() { stopProcess(t, p) })
	return p
}

func stopProcess(t testing.TB, p *service.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Shutdown(ctx))
}

// pctl runs the pctl binary; it returns stdout, stderr and the error.
func pctl(t testing.TB, dataDir, stdin string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(bin("pctl"), append([]string{"--data-dir", dataDir}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

func mustPctl(t testing.TB, dataDir, stdin string, args ...string) string {
	t.Helper()
	out, errOut, err := pctl(t, dataDir, stdin, args...)
	require.NoError(t, err, "pctl %v: %s", args, errOut)
	return out
}

var joinRe = regexp.MustCompile(`--token (\S+) --ca-pin (sha256:[0-9a-f]+)`)

// adminClient opens an auth client with the admin identity of dataDir.
func adminClient(t testing.TB, dataDir string, p *service.Process) *auth.Client {
	t.Helper()
	id, err := auth.ReadIdentity(config.AdminIdentityDir(dataDir))
	require.NoError(t, err)
	clt, err := auth.NewClient(auth.ClientConfig{Addr: p.Addr(service.ListenerAuth).String(), Identity: id})
	require.NoError(t, err)
	t.Cleanup(func() { clt.Close() })
	return clt
}

func waitNodes(t testing.TB, clt *auth.Client, want int) []services.Node {
	t.Helper()
	var nodes []services.Node
	require.Eventually(t, func() bool {
		var err error
		nodes, err = clt.GetNodes(context.Background(), "")
		return err == nil && len(nodes) == want
	}, 20*time.Second, 50*time.Millisecond, "want %d nodes, have %v", want, nodes)
	return nodes
}

// TestClusterLifecycle is the foundation's promise: an all-in-one cluster
// starts, takes a user, lets a second node join with a token, lists both
// nodes, and keeps users, CAs and nodes across a restart on the same data
// dir.
func TestClusterLifecycle(t *testing.T) {
	dir1 := t.TempDir()
	a := startProcess(t, procConfig(dir1, config.RoleAuth, config.RoleNode))

	out := mustPctl(t, dir1, "correct horse battery\n", "users", "add", "alice", "--logins", "alice,root")
	require.Contains(t, out, `User "alice" added`)
	_, errOut, err := pctl(t, dir1, "correct horse battery\n", "users", "add", "alice", "--logins", "alice")
	require.Error(t, err)
	require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "one line: %q", errOut)
	require.Contains(t, errOut, `user "alice" already exists`)

	out = mustPctl(t, dir1, "", "tokens", "add", "--type", "node")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, "join command in %q", out)
	require.Contains(t, out, "--auth-server "+a.Addr(service.ListenerAuth).String())
	token, pin := m[1], m[2]

	dir2 := t.TempDir()
	cfg2 := procConfig(dir2, config.RoleNode)
	cfg2.AuthServer, cfg2.Token, cfg2.CAPin, cfg2.NodeName = a.Addr(service.ListenerAuth).String(), token, pin, "second"
	cfg2.Labels = map[string]string{"env": "test"}
	b := startProcess(t, cfg2)

	clt := adminClient(t, dir1, a)
	nodes := waitNodes(t, clt, 2)
	byUUID := map[string]services.Node{}
	for _, n := range nodes {
		byUUID[n.UUID] = n
	}
	require.Equal(t, "second", byUUID[b.HostUUID()].Hostname)
	require.Equal(t, b.Addr(service.ListenerNode).String(), byUUID[b.HostUUID()].Addr)
	require.Equal(t, map[string]string{"env": "test"}, byUUID[b.HostUUID()].Labels)

	// The token was single use: a third host cannot reuse it, and nothing
	// of it is left behind.
	dir3 := t.TempDir()
	cfg3 := procConfig(dir3, config.RoleNode)
	cfg3.AuthServer, cfg3.Token, cfg3.CAPin = cfg2.AuthServer, token, pin
	p3, err := service.New(cfg3, testOptions())
	require.NoError(t, err)
	err = p3.Start(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), "token")
	stopProcess(t, p3)
	require.NoDirExists(t, filepath.Join(dir3, "identity", "node"))

	jsonOut := mustPctl(t, dir1, "", "nodes", "ls", "--format", "json")
	require.Contains(t, jsonOut, `"hostname": "second"`)
	textOut := mustPctl(t, dir1, "", "nodes", "ls")
	require.Contains(t, textOut, "env=test")

	userCA, err := clt.GetCertAuthority(context.Background(), clusterName, services.UserCA, false)
	require.NoError(t, err)

	// Restart the auth server on the same data dir: same CA, same user,
	// nodes still in the inventory, and the joined node keeps working
	// without its (spent) token.
	stopProcess(t, b)
	stopProcess(t, a)
	a2 := startProcess(t, procConfig(dir1, config.RoleAuth, config.RoleNode))
	clt2 := adminClient(t, dir1, a2)
	userCA2, err := clt2.GetCertAuthority(context.Background(), clusterName, services.UserCA, false)
	require.NoError(t, err)
	require.Equal(t, userCA.SSHPublicKeys, userCA2.SSHPublicKeys)
	users, err := clt2.GetUsers(context.Background())
	require.NoError(t, err)
	require.Len(t, users, 1)
	require.Equal(t, "alice", users[0].Name)
	waitNodes(t, clt2, 2)

	cfg2b := procConfig(dir2, config.RoleNode)
	cfg2b.AuthServer, cfg2b.NodeName = a2.Addr(service.ListenerAuth).String(), "second"
	startProcess(t, cfg2b)
}

// TestClusterNameIsPinned: the data dir remembers its cluster.
func TestClusterNameIsPinned(t *testing.T) {
	dir := t.TempDir()
	a := startProcess(t, procConfig(dir, config.RoleAuth))
	stopProcess(t, a)
	cfg := procConfig(dir, config.RoleAuth)
	cfg.ClusterName = "other"
	p, err := service.New(cfg, testOptions())
	require.NoError(t, err)
	err = p.Start(context.Background())
	stopProcess(t, p)
	require.Error(t, err)
	require.Contains(t, err.Error(), `belongs to cluster "it"`)
}

// TestClusterOnEtcd runs the auth role on a real embedded etcd: the state
// survives a restart of the auth server because it lives in etcd, not in
// the data dir.
func TestClusterOnEtcd(t *testing.T) {
	etcd := etcdtest.Start(t)
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleAuth, config.RoleNode)
	cfg.Backend = config.BackendConfig{Type: config.BackendEtcd, EtcdEndpoints: etcd.Endpoints, EtcdPrefix: "/it"}
	a := startProcess(t, cfg)
	mustPctl(t, dir, "correct horse battery\n", "users", "add", "erin", "--logins", "erin")
	clt := adminClient(t, dir, a)
	waitNodes(t, clt, 1)
	stopProcess(t, a)

	cfg2 := procConfig(dir, config.RoleAuth)
	cfg2.Backend = cfg.Backend
	a2 := startProcess(t, cfg2)
	out := mustPctl(t, dir, "", "users", "ls")
	require.Contains(t, out, "erin ")
	clt2 := adminClient(t, dir, a2)
	nodes, err := clt2.GetNodes(context.Background(), "")
	require.NoError(t, err)
	require.Len(t, nodes, 1, "the node record lives in etcd")
}
