package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// launchDaemon starts `postern start` on loopback ports without waiting
// for it; waitDaemon waits until its auth API answers pctl. Split so that
// several daemons can be started at the same instant.
// A listener flag in extra (--auth-addr 127.0.0.1:PORT, to come back on
// the same address after a restart) replaces its 127.0.0.1:0 default.
func launchDaemon(t *testing.T, dataDir string, extra ...string) *daemon {
	t.Helper()
	args := []string{"start", "--data-dir", dataDir, "--cluster-name", clusterName}
	for _, flag := range []string{"--auth-addr", "--node-addr", "--ssh-addr", "--web-addr", "--tunnel-addr", "--diag-addr"} {
		if !slices.Contains(extra, flag) {
			args = append(args, flag, "127.0.0.1:0")
		}
	}
	d := &daemon{dataDir: dataDir, stderr: &syncBuffer{}}
	d.exec(t, append(args, extra...))
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
	})
	return d
}

// exec starts the process with args; the one Cleanup of launchDaemon
// kills whichever process is current.
func (d *daemon) exec(t *testing.T, args []string) {
	t.Helper()
	cmd, done := exec.Command(bin("postern"), args...), make(chan error, 1)
	cmd.Stderr = d.stderr
	require.NoError(t, cmd.Start())
	go func() { done <- cmd.Wait() }()
	d.cmd, d.done = cmd, done
}

// restart starts the daemon again with the same arguments (same data dir
// and, given fixed listener addresses, the same ports) after it exited,
// and waits for it.
func (d *daemon) restart(t *testing.T) {
	t.Helper()
	err := <-d.done
	d.done <- err
	d.exec(t, d.cmd.Args[1:])
	d.wait(t)
}

func (d *daemon) wait(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("postern exited during start-up: %v\n%s", err, d.stderr.String())
		default:
		}
		_, _, err := pctl(t, d.dataDir, "", "users", "ls")
		return err == nil
	}, 60*time.Second, 100*time.Millisecond)
}

// authAddr is the auth API address the daemon wrote for pctl.
func (d *daemon) authAddr(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(config.AdminIdentityDir(d.dataDir), config.AuthAddrFile))
	require.NoError(t, err)
	return strings.TrimSpace(string(data))
}

// kill9 kills the daemon as a crash would.
func (d *daemon) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGKILL))
	err := <-d.done
	d.done <- err
}

// haAuth is two auth daemons on one three-member etcd, started at the
// same instant on an empty keyspace.
type haAuth struct {
	etcd *etcdtest.Cluster
	a, b *daemon
}

func startHAAuth(t *testing.T) *haAuth {
	t.Helper()
	etcd := etcdtest.StartCluster(t, 3)
	args := []string{"--roles", "auth", "--backend", "etcd", "--etcd-endpoints", strings.Join(etcd.Endpoints, ",")}
	a := launchDaemon(t, t.TempDir(), args...)
	b := launchDaemon(t, t.TempDir(), args...)
	a.wait(t)
	b.wait(t)
	return &haAuth{etcd: etcd, a: a, b: b}
}

// addrs is the --auth-server list of both.
func (h *haAuth) addrs(t *testing.T) string { return h.a.authAddr(t) + "," + h.b.authAddr(t) }

// clientOf is an admin client of d's identity, pointed at addr.
func clientOf(t *testing.T, d *daemon, addr string) *auth.Client {
	t.Helper()
	id, err := auth.ReadIdentity(config.AdminIdentityDir(d.dataDir))
	require.NoError(t, err)
	clt, err := auth.NewClient(auth.ClientConfig{Addr: addr, Identity: id})
	require.NoError(t, err)
	t.Cleanup(func() { clt.Close() })
	return clt
}

// TestHATwoAuthServersOneCA starts two auth processes at the same instant
// on an empty three-member etcd: there is one set of CAs (both serve the
// same user and host CA, each one's admin identity is accepted by the
// other, pctl prints the same CA pin through either), and what one
// writes the other serves.
func TestHATwoAuthServersOneCA(t *testing.T) {
	h := startHAAuth(t)
	ctx := context.Background()
	ca := func(clt *auth.Client, typ services.CertAuthType) []string {
		got, err := clt.GetCertAuthority(ctx, clusterName, typ, false)
		require.NoError(t, err)
		return got.SSHPublicKeys
	}
	// a's identity against b's server and the reverse: both TLS certs
	// chain to the one cluster CA.
	ab := clientOf(t, h.a, h.b.authAddr(t))
	ba := clientOf(t, h.b, h.a.authAddr(t))
	for _, typ := range []services.CertAuthType{services.UserCA, services.HostCA} {
		require.Equal(t, ca(ab, typ), ca(ba, typ), "%s CA", typ)
		require.Len(t, ca(ab, typ), 1, "%s CA: one key, not two", typ)
	}
	pinOf := func(d *daemon) string {
		m := joinRe.FindStringSubmatch(mustPctl(t, d.dataDir, "", "tokens", "add", "--type", "node"))
		require.NotNil(t, m)
		return m[2]
	}
	require.Equal(t, pinOf(h.a), pinOf(h.b))

	mustPctl(t, h.a.dataDir, "correct horse battery\n", "users", "add", "alice", "--logins", "alice")
	require.Contains(t, mustPctl(t, h.b.dataDir, "", "users", "ls"), "alice")
}

// TestHAAuthFailover: with --auth-server listing both auth processes,
// a node joins and heartbeats and pctl works; after kill -9 of the auth
// process in use, pctl, a new join and the node's heartbeats carry on
// through the other one.
func TestHAAuthFailover(t *testing.T) {
	h := startHAAuth(t)
	list := h.addrs(t)
	admin := config.AdminIdentityDir(h.a.dataDir)
	pctlList := func(args ...string) (string, string, error) {
		return pctl(t, h.a.dataDir, "", append([]string{"--auth-server", list, "--identity", admin}, args...)...)
	}
	join := func(name string) {
		m := joinRe.FindStringSubmatch(mustPctl(t, h.b.dataDir, "", "tokens", "add", "--type", "node"))
		require.NotNil(t, m)
		cfg := procConfig(t.TempDir(), config.RoleNode)
		cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = list, m[1], m[2], name
		startProcess(t, cfg)
	}
	join("first")
	require.Eventually(t, func() bool {
		out, _, err := pctlList("nodes", "ls")
		return err == nil && strings.Contains(out, "first")
	}, 20*time.Second, 100*time.Millisecond)

	h.a.kill9(t)
	killed := time.Now()
	out, errOut, err := pctlList("nodes", "ls")
	require.NoError(t, err, "pctl fails over: %s", errOut)
	require.Contains(t, out, "first")
	join("second")
	clt := clientOf(t, h.b, h.b.authAddr(t))
	require.Eventually(t, func() bool {
		nodes, err := clt.GetNodes(context.Background(), "")
		if err != nil || len(nodes) != 2 {
			return false
		}
		// Both nodes heartbeat after the kill: their records were
		// renewed through the surviving auth server.
		for _, n := range nodes {
			if !n.LastHeartbeat.After(killed) {
				return false
			}
		}
		return true
	}, 30*time.Second, 200*time.Millisecond)
}

// readyz fetches the diagnostics /readyz of p.
func readyz(t *testing.T, p *service.Process) (int, map[string]string) {
	t.Helper()
	resp, err := http.Get("http://" + p.Addr(service.ListenerDiag).String() + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// TestHAEtcdQuorum runs a cluster on a three-member etcd. With one member
// down, logins, routing and new sessions carry on and /readyz is 200.
// With two down (no quorum) the process keeps running: /readyz is 503 and
// says it is etcd, naming the endpoints; logins answer 503; a session
// already open stays up. When the members return it recovers by itself:
// /readyz 200 (the NodeWatcher re-synced), logins and new sessions work.
func TestHAEtcdQuorum(t *testing.T) {
	etcd := etcdtest.StartCluster(t, 3)
	c := newAllInOneWith(t, func(cfg *config.Config) {
		cfg.Backend = config.BackendConfig{Type: config.BackendEtcd, EtcdEndpoints: etcd.Endpoints, EtcdPrefix: "/quorum"}
	})
	hc := c.webClient(t)
	webAddr := c.p.Addr(service.ListenerWeb).String()
	login := func() int {
		status, body, err := postCerts(t, hc, webAddr, "alice", "correct horse battery")
		require.NoError(t, err)
		t.Logf("login: %d %.120s", status, body)
		return status
	}
	require.Equal(t, http.StatusOK, login())
	clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
	require.NoError(t, err)
	ls := startLineSession(t, clt, "sh")

	etcd.Members[0].Stop()
	require.Eventually(t, func() bool { return login() == http.StatusOK }, 20*time.Second, 200*time.Millisecond,
		"logins carry on with one etcd member down")
	clt2, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
	require.NoError(t, err, "new sessions route with one member down")
	got, err := run(t, clt2, "echo one-down")
	require.NoError(t, err)
	require.Equal(t, "one-down\n", got)
	mustPctl(t, c.dataDir, "password-bob\n", "users", "add", "bob", "--logins", c.login)
	code, ready := readyz(t, c.p)
	require.Equal(t, http.StatusOK, code, "%v", ready)

	etcd.Members[1].Stop()
	var reason string
	require.Eventually(t, func() bool {
		code, ready := readyz(t, c.p)
		reason = ready["backend"]
		return code == http.StatusServiceUnavailable && reason != "ok"
	}, 20*time.Second, 200*time.Millisecond)
	t.Logf("readyz without quorum: backend: %s", reason)
	require.Contains(t, reason, "etcd at ")
	require.Contains(t, reason, etcd.Endpoints[2])
	require.Equal(t, http.StatusServiceUnavailable, login())
	got, err = ls.roundTrip("echo no-quorum")
	require.NoError(t, err, "an open session does not need etcd")
	require.Equal(t, "no-quorum\n", got)

	etcd.Members[0].Restart(t)
	etcd.Members[1].Restart(t)
	require.Eventually(t, func() bool {
		code, _ := readyz(t, c.p)
		return code == http.StatusOK
	}, 60*time.Second, 200*time.Millisecond, "readyz recovers (backend and NodeWatcher)")
	require.Eventually(t, func() bool { return login() == http.StatusOK }, 30*time.Second, 200*time.Millisecond)
	var clt3 *ssh.Client
	require.Eventually(t, func() bool {
		clt3, err = c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the node routes again")
	got, err = run(t, clt3, "echo after")
	require.NoError(t, err)
	require.Equal(t, "after\n", got)
	got, err = ls.roundTrip("echo still")
	require.NoError(t, err)
	require.Equal(t, "still\n", got)
}

// TestHAEtcdTLS runs auth on an etcd that only speaks mutual TLS, set up
// with backend.etcd_tls in postern.yaml: it starts and serves logins. With
// the CA of another PKI, `postern start` fails in one line that names the
// etcd endpoint; a client certificate without its key is refused before
// anything is dialed, naming the setting.
func TestHAEtcdTLS(t *testing.T) {
	srv := etcdtest.StartTLS(t)
	f := srv.TLS
	yamlFor := func(ca, cert, key string) string {
		path := filepath.Join(t.TempDir(), "postern.yaml")
		body := "backend:\n  type: etcd\n  etcd_endpoints: [" + srv.Endpoints[0] + "]\n  etcd_prefix: /tls\n" +
			"  etcd_tls:\n    ca_file: " + ca + "\n"
		if cert != "" {
			body += "    cert_file: " + cert + "\n"
		}
		if key != "" {
			body += "    key_file: " + key + "\n"
		}
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		return path
	}

	d := launchDaemon(t, t.TempDir(), "--roles", "auth", "--config", yamlFor(f.CAFile, f.CertFile, f.KeyFile))
	d.wait(t)
	mustPctl(t, d.dataDir, "correct horse battery\n", "users", "add", "alice", "--logins", "alice")
	require.Contains(t, mustPctl(t, d.dataDir, "", "users", "ls"), "alice")

	for name, tc := range map[string]struct{ cfg, want string }{
		"another CA":          {yamlFor(f.OtherCAFile, f.CertFile, f.KeyFile), srv.Endpoints[0] + ": TLS: tls: failed to verify certificate"},
		"certificate, no key": {yamlFor(f.CAFile, f.CertFile, ""), "cert_file and key_file go together"},
		"missing CA file":     {yamlFor("/nonexistent/ca.pem", f.CertFile, f.KeyFile), "/nonexistent/ca.pem"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(bin("postern"), "start", "--roles", "auth", "--config", tc.cfg, "--data-dir", t.TempDir(),
				"--auth-addr", "127.0.0.1:0", "--diag-addr", "127.0.0.1:0", "--cluster-name", clusterName)
			out, err := cmd.CombinedOutput()
			require.Error(t, err)
			var errLines []string
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if strings.HasPrefix(l, "ERROR") {
					errLines = append(errLines, l)
				}
			}
			require.Len(t, errLines, 1, "one error line: %s", out)
			require.Contains(t, errLines[0], tc.want)
			t.Logf("%s", errLines[0])
		})
	}
}
