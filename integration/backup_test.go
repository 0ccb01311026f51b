package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/backend/schema"
	"github.com/postern-dev/postern/lib/backend/sqlite"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// posternRestore runs `postern restore`; it returns the combined output.
func posternRestore(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(bin("postern"), append([]string{"restore"}, args...)...).CombinedOutput()
	return string(out), err
}

// TestBackupWhileSessionsRunAndRestore: pctl backup while an SSH session
// is open (and stays open), postern restore into a fresh data dir, a new
// cluster started on it: a certificate issued before the backup logs in
// through the new proxy to the new node, whose host certificate the old
// known_hosts accepts (same CAs), and the user's password still works.
func TestBackupWhileSessionsRunAndRestore(t *testing.T) {
	c := newAllInOne(t)
	e := newPshEnv(t, c)
	e.login(t, "alice", alicePassword+"\n")

	nodePort := strconv.Itoa(c.p.Addr(service.ListenerNode).(*net.TCPAddr).Port)
	clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, nodePort))
	require.NoError(t, err)
	// The login shell's start-up files can take many seconds on a loaded
	// machine (root's pyenv init here): wait for the session to be up
	// before timing round trips.
	ls := startLineSession(t, clt, "echo ready; cat")
	ready := make(chan string, 1)
	go func() { l, _ := ls.out.ReadString('\n'); ready <- l }()
	select {
	case l := <-ready:
		require.Equal(t, "ready\n", l)
	case <-time.After(2 * time.Minute):
		t.Fatal("the session did not start within 2m")
	}
	out, err := ls.roundTrip("before")
	require.NoError(t, err)
	require.Equal(t, "before\n", out)

	file := filepath.Join(t.TempDir(), "postern.backup")
	out = mustPctl(t, c.dataDir, "", "backup", "--out", file)
	require.Contains(t, out, `Backup of cluster "it" written to `+file)
	st, err := os.Stat(file)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	// The session went on through the backup.
	out, err = ls.roundTrip("after")
	require.NoError(t, err)
	require.Equal(t, "after\n", out)
	// psh works against the cluster that was backed up, too.
	require.Equal(t, "psh\n", e.mustRun(t, "", "ssh", c.hostname, "echo psh"))

	// A failed backup leaves no file: the directory does not exist.
	bad := filepath.Join(t.TempDir(), "missing", "postern.backup")
	_, errOut, err := pctl(t, c.dataDir, "", "backup", "--out", bad)
	require.Error(t, err)
	require.Contains(t, errOut, "backup not written")
	require.NoFileExists(t, bad)

	// Restore refuses the live data dir by name, and fills a fresh one.
	out, err = posternRestore(t, "--data-dir", c.dataDir, file)
	require.Error(t, err)
	require.Contains(t, out, "data dir "+c.dataDir+" is not empty")
	dir2 := filepath.Join(t.TempDir(), "restored")
	out, err = posternRestore(t, "--data-dir", dir2, file)
	require.NoError(t, err, out)
	require.Contains(t, out, `of cluster "it"`)

	cfg := procConfig(dir2, config.RoleAuth, config.RoleProxy, config.RoleNode)
	cfg.NodeName = "node-2"
	p2 := startProcess(t, cfg)
	clt2admin := adminClient(t, dir2, p2)
	require.Eventually(t, func() bool {
		nodes, err := clt2admin.GetNodes(context.Background(), "")
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.Hostname == "node-2" {
				return true
			}
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "node-2 in the restored cluster's inventory")
	restored := &allInOne{p: p2, dataDir: dir2, login: c.login, hostname: "node-2", keyPath: c.keyPath}
	port2 := strconv.Itoa(p2.Addr(service.ListenerNode).(*net.TCPAddr).Port)
	clt2, err := restored.viaJump(t, net.JoinHostPort("node-2", port2))
	require.NoError(t, err, "the certificate from before the backup logs in to the restored cluster")
	out, err = run(t, clt2, "echo restored")
	require.NoError(t, err)
	// Only a suffix: the login's shell start-up files may print (stderr
	// is in run's output).
	require.True(t, strings.HasSuffix(out, "restored\n"), "output: %q", out)

	e2 := newPshEnv(t, restored)
	e2.login(t, "alice", alicePassword+"\n")
	require.Equal(t, "psh2\n", e2.mustRun(t, "", "ssh", "node-2", "echo psh2"))
}

// copyDir copies a fixture so that no test writes into it.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	require.NoError(t, filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o600)
	}))
	return dst
}

// TestStartFromPreviousReleaseDataDir starts this build on a copy of the
// data dir written by the previous release (fixtures/datadir-v1): it
// serves the same CAs, users, roles and nodes.
func TestStartFromPreviousReleaseDataDir(t *testing.T) {
	dir := copyDir(t, "../fixtures/datadir-v1")
	cfg := procConfig(dir, config.RoleAuth)
	cfg.ClusterName = "fixture"
	p := startProcess(t, cfg)
	clt := adminClient(t, dir, p)
	ctx := context.Background()
	users, err := clt.GetUsers(ctx)
	require.NoError(t, err)
	require.Len(t, users, 1)
	require.Equal(t, "alice", users[0].Name)
	_, err = clt.GetRole(ctx, "ops")
	require.NoError(t, err)
	nodes, err := clt.GetNodes(ctx, "fixture")
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	require.Equal(t, "fixture-node", nodes[0].Hostname)
	_, err = clt.GetCertAuthority(ctx, "fixture", services.UserCA, false)
	require.NoError(t, err)
}

// TestNewerSchemaIsRefused: a data dir and a backup written by a newer
// Postern are both refused, naming both versions.
func TestNewerSchemaIsRefused(t *testing.T) {
	ctx := context.Background()
	dir := copyDir(t, "../fixtures/datadir-v1")
	b, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "backend", "postern.db")})
	require.NoError(t, err)
	_, err = b.Put(ctx, backend.Item{Key: schema.Key, Value: []byte(`{"version":99}`)})
	require.NoError(t, err)
	require.NoError(t, b.Close())

	cfg := procConfig(dir, config.RoleAuth)
	cfg.ClusterName = "fixture"
	p, err := service.New(cfg, testOptions())
	require.NoError(t, err)
	err = p.Start(ctx)
	stopProcess(t, p)
	require.Error(t, err)
	require.Contains(t, err.Error(), "schema version is 99, newer than version 1 of this Postern")

	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err = zw.Write([]byte(`{"format":"postern-backup","format_version":1,"schema_version":99,"postern":"v9.0.0","cluster_name":"it"}` + "\n" + `{"end":{"items":0}}` + "\n"))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	file := filepath.Join(t.TempDir(), "newer.backup")
	require.NoError(t, os.WriteFile(file, buf.Bytes(), 0o600))
	dir2 := filepath.Join(t.TempDir(), "restored")
	out, err := posternRestore(t, "--data-dir", dir2, file)
	require.Error(t, err)
	require.Contains(t, out, "written by Postern v9.0.0")
	require.Contains(t, out, "schema version is 99, newer than version 1 of this Postern")
	require.NoDirExists(t, dir2)
}

// TestBackupEtcdToSQLiteAndBack: a cluster on etcd is backed up with pctl
// and restored into a SQLite data dir; that cluster's backup is restored
// into a new etcd prefix (postern restore --config); each cluster serves
// the same user CA and users.
func TestBackupEtcdToSQLiteAndBack(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleAuth)
	cfg.Backend = config.BackendConfig{Type: config.BackendEtcd, EtcdEndpoints: etcd.Endpoints, EtcdPrefix: "/it-a"}
	a := startProcess(t, cfg)
	mustPctl(t, dir, "correct horse battery\n", "users", "add", "erin", "--logins", "erin")
	userCA, err := adminClient(t, dir, a).GetCertAuthority(ctx, clusterName, services.UserCA, false)
	require.NoError(t, err)
	fromEtcd := filepath.Join(t.TempDir(), "etcd.backup")
	mustPctl(t, dir, "", "backup", "--out", fromEtcd)

	// etcd -> SQLite.
	liteDir := filepath.Join(t.TempDir(), "lite")
	out, err := posternRestore(t, "--data-dir", liteDir, fromEtcd)
	require.NoError(t, err, out)
	lite := startProcess(t, procConfig(liteDir, config.RoleAuth))
	check := func(dataDir string, p *service.Process) {
		t.Helper()
		clt := adminClient(t, dataDir, p)
		ca, err := clt.GetCertAuthority(ctx, clusterName, services.UserCA, false)
		require.NoError(t, err)
		require.Equal(t, userCA.SSHPublicKeys, ca.SSHPublicKeys)
		require.Contains(t, mustPctl(t, dataDir, "", "users", "ls"), "erin ")
	}
	check(liteDir, lite)
	fromLite := filepath.Join(t.TempDir(), "lite.backup")
	mustPctl(t, liteDir, "", "backup", "--out", fromLite)

	// SQLite -> etcd, under a new prefix; the old one is refused (not empty).
	yaml := func(prefix string) string {
		path := filepath.Join(t.TempDir(), "postern.yaml")
		require.NoError(t, os.WriteFile(path, []byte("cluster_name: "+clusterName+"\nbackend:\n  type: etcd\n  etcd_endpoints: ["+etcd.Endpoints[0]+"]\n  etcd_prefix: "+prefix+"\n"), 0o600))
		return path
	}
	out, err = posternRestore(t, "--config", yaml("/it-a"), fromLite)
	require.Error(t, err)
	require.Contains(t, out, "etcd prefix /it-a")
	require.Contains(t, out, "not empty")
	out, err = posternRestore(t, "--config", yaml("/it-b"), fromLite)
	require.NoError(t, err, out)
	dirB := t.TempDir()
	cfgB := procConfig(dirB, config.RoleAuth)
	cfgB.Backend = config.BackendConfig{Type: config.BackendEtcd, EtcdEndpoints: etcd.Endpoints, EtcdPrefix: "/it-b"}
	check(dirB, startProcess(t, cfgB))
}
