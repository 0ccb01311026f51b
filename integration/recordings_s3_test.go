package integration

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/recording/s3test"
	"github.com/postern-dev/postern/lib/service"
)

// TestRecordingsSharedAcrossAuthServers: two auth processes (`postern
// start` with a config file) on one etcd keep recordings in one S3 bucket
// (a real S3 server over TLS, s3test). One node uploads to the first,
// another to the second; through either auth server `pctl recordings ls`
// lists both sessions, complete, and `pctl recordings verify` passes
// for both. Before, each auth server kept its nodes' recordings on its
// own disk and answered "not found" for the other half.
func TestRecordingsSharedAcrossAuthServers(t *testing.T) {
	requireOpenSSH(t, "ssh")
	cfgFile := s3RecordingsConfig(t, s3test.Start(t, s3test.Options{TLS: true}))

	etcd := etcdtest.StartCluster(t, 1)
	args := []string{"--roles", "auth", "--backend", "etcd", "--etcd-endpoints", strings.Join(etcd.Endpoints, ","), "--config", cfgFile}
	a := launchDaemon(t, t.TempDir(), args...)
	b := launchDaemon(t, t.TempDir(), args...)
	a.wait(t)
	b.wait(t)
	require.Contains(t, a.stderr.String(), "Recordings are kept in S3.")

	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, a.dataDir, alicePassword+"\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, a.dataDir, "", "auth", "sign", "--user", "alice", "--ttl", "10m", "--out", keyPath)
	px, _ := startHAProxy(t, a.dataDir, a.authAddr(t)+","+b.authAddr(t), "edge", nil)

	for _, n := range []struct {
		name string
		auth *daemon
	}{{"node-on-a", a}, {"node-on-b", b}} {
		token, pin := nodeToken(t, a.dataDir)
		ncfg := procConfig(t.TempDir(), config.RoleNode)
		ncfg.AuthServer, ncfg.Token, ncfg.CAPin, ncfg.NodeName = n.auth.authAddr(t), token, pin, n.name
		startProcess(t, ncfg)
	}
	waitNodes(t, clientOf(t, b, b.authAddr(t)), 2)

	for _, node := range []string{"node-on-a", "node-on-b"} {
		cfg := (&allInOne{login: u.Username, keyPath: keyPath}).opensshConfigVia(t, px.Addr(service.ListenerProxySSH), node)
		out, err := exec.Command("ssh", "-F", cfg, node, "echo recorded-on-$((1+1))-"+node).CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "recorded-on-2-"+node+"\n", string(out))
	}

	for name, d := range map[string]*daemon{"first": a, "second": b} {
		ids := map[string]string{}
		require.Eventually(t, func() bool {
			ls, _, err := pctl(t, d.dataDir, "", "recordings", "ls")
			if err != nil {
				return false
			}
			for _, line := range strings.Split(ls, "\n") {
				for _, node := range []string{"node-on-a", "node-on-b"} {
					if strings.Contains(line, "recorded-on-") && strings.Contains(line, node) && regexp.MustCompile(`\btrue\b`).MatchString(line) {
						ids[node] = strings.Fields(line)[0]
					}
				}
			}
			return len(ids) == 2
		}, 30*time.Second, 200*time.Millisecond, "the %s auth server lists both complete recordings: %v", name, ids)
		for node, id := range ids {
			out := mustPctl(t, d.dataDir, "", "recordings", "verify", id)
			require.Regexp(t, `OK: \d+ chunks, hash chain intact .*complete`, out, "%s through the %s auth server", node, name)
		}
	}
}

// s3RecordingsConfig writes a postern.yaml that keeps recordings in the
// bucket of s3 (over TLS, path-style) and returns its path.
func s3RecordingsConfig(t *testing.T, s3 *s3test.Server) string {
	t.Helper()
	cfgFile := filepath.Join(t.TempDir(), "postern.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`recordings:
  s3:
    endpoint: %s
    bucket: %s
    region: %s
    access_key_file: %s
    secret_key_file: %s
    tls_ca_file: %s
    path_style: true
  retention: 90d
`, s3.Endpoint, s3.Bucket, s3.Region, s3.AccessKeyFile, s3.SecretKeyFile, s3.CAFile)), 0o600))
	return cfgFile
}
