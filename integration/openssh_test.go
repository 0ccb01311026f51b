package integration

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// TestOpenSSHNodeAgentless: a stock sshd (Debian's, on loopback) taken
// into a running cluster with `pctl nodes add-openssh`, as an admin does
// it: the host key fetched and confirmed, the three files, sshd
// restarted with the snippet. Then psh ssh and OpenSSH's ssh -J (strict
// host key checking through `psh config`) reach it, scp through the
// proxy is byte-exact, a login the roles do not allow is refused by sshd
// itself on a direct connection, `pctl nodes ls` shows it as openssh,
// killing sshd makes it offline and restarting brings it back;
// rotate-openssh reissues the certificate, `pctl nodes rm` removes it.
func TestOpenSSHNodeAgentless(t *testing.T) {
	requireOpenSSH(t, "ssh", "scp")
	d := srvtest.StartSSHD(t, srvtest.SSHDConfig{})
	c := newAllInOne(t)
	out := filepath.Join(t.TempDir(), "legacy")
	add := []string{"nodes", "add-openssh", "--name", "legacy", "--addr", d.Addr, "--labels", "env=it,os=debian", "--out", out}
	fp := ssh.FingerprintSHA256(d.HostKey)

	// Not confirmed: nothing registered.
	stdout, errOut, err := pctl(t, c.dataDir, "n\n", add...)
	require.Error(t, err)
	require.Contains(t, stdout, fp, "the fingerprint is shown before the question")
	require.Contains(t, errOut, "host key not confirmed")
	require.NotContains(t, mustPctl(t, c.dataDir, "", "nodes", "ls"), "legacy")

	stdout = mustPctl(t, c.dataDir, "y\n", add...)
	require.Contains(t, stdout, "ssh-ed25519 "+fp)
	require.Contains(t, stdout, `OpenSSH node "legacy" registered`)
	for _, f := range []string{"ssh_host_cert", "postern_user_ca.pub", "sshd_config.snippet"} {
		st, err := os.Stat(filepath.Join(out, f))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o644), st.Mode().Perm(), f)
	}
	snippet, err := os.ReadFile(filepath.Join(out, "sshd_config.snippet"))
	require.NoError(t, err)
	for _, l := range []string{"TrustedUserCAKeys " + filepath.Join(out, "postern_user_ca.pub"), "HostCertificate " + filepath.Join(out, "ssh_host_cert"), "AuthorizedPrincipalsFile none"} {
		require.Contains(t, string(snippet), "\n"+l+"\n")
	}
	certBytes, err := os.ReadFile(filepath.Join(out, "ssh_host_cert"))
	require.NoError(t, err)
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	require.NoError(t, err)
	cert := pub.(*ssh.Certificate)
	require.Equal(t, d.HostKey.Marshal(), cert.Key.Marshal())
	require.ElementsMatch(t, []string{"legacy", "legacy." + clusterName, "127.0.0.1"}, cert.ValidPrincipals)

	// The admin's three lines, and scp's sftp server.
	d.Stop()
	d.Reconfigure(t, "Include "+filepath.Join(out, "sshd_config.snippet"), "Subsystem sftp internal-sftp")
	d.Start(t)

	ls := mustPctl(t, c.dataDir, "", "nodes", "ls")
	require.Regexp(t, `(?m)^legacy +\S+ +`+regexp.QuoteMeta(d.Addr)+` +env=it,os=debian +- +openssh +(online|offline)$`, ls)
	require.Regexp(t, `(?m)^node-1 +.* +postern +online$`, ls)

	e := newPshEnv(t, c)
	e.login(t, "alice", alicePassword+"\n")
	// The proxy's health checker saw the server without a certificate,
	// so it may still call it offline for one backoff.
	waitPshSSH := func(what string) {
		t.Helper()
		var last string
		require.Eventually(t, func() bool {
			stdout, errOut, code := e.run(t, "", "ssh", "legacy", "echo on-legacy; whoami")
			last = fmt.Sprintf("exit %d: %s%s", code, stdout, errOut)
			return code == 0 && stdout == "on-legacy\n"+c.login+"\n"
		}, 60*time.Second, 250*time.Millisecond, "%s: last try: %s", what, last)
	}
	waitPshSSH("psh ssh to the registered server")

	t.Run("ssh -J and scp through psh config", func(t *testing.T) {
		cfg := e.mustRun(t, "", "config")
		keyFile := filepath.Join(e.home, "keys", e.webAddr(), "alice")
		nodeBlock := fmt.Sprintf("Host legacy\n    ProxyJump %s-proxy\n    IdentityFile %s\n    CertificateFile %s-cert.pub\n    IdentitiesOnly yes\n    UserKnownHostsFile %s\n",
			clusterName, keyFile, keyFile, filepath.Join(e.home, "known_hosts"))
		path := filepath.Join(t.TempDir(), "ssh_config")
		require.NoError(t, os.WriteFile(path, []byte(cfg+nodeBlock+"Host *\n    StrictHostKeyChecking yes\n    GlobalKnownHostsFile /dev/null\n    BatchMode yes\n    LogLevel ERROR\n"), 0o600))
		target := c.login + "@legacy"

		cmd := exec.Command("ssh", "-F", path, target, "echo via-openssh")
		cmd.Env = withoutEnv(e.env(), "POSTERN_HOME")
		o, err := output(cmd)
		require.NoError(t, err, string(o))
		require.Equal(t, "via-openssh\n", string(o))

		dir := t.TempDir()
		data := make([]byte, 1<<20)
		_, err = rand.Read(data)
		require.NoError(t, err)
		src := filepath.Join(dir, "src")
		require.NoError(t, os.WriteFile(src, data, 0o600))
		scp := exec.Command("scp", "-F", path, src, target+":"+filepath.Join(dir, "up"))
		scp.Env = e.env()
		o, err = scp.CombinedOutput()
		require.NoError(t, err, string(o))
		scp = exec.Command("scp", "-F", path, target+":"+filepath.Join(dir, "up"), filepath.Join(dir, "down"))
		scp.Env = e.env()
		o, err = scp.CombinedOutput()
		require.NoError(t, err, string(o))
		for _, f := range []string{"up", "down"} {
			got, err := os.ReadFile(filepath.Join(dir, f))
			require.NoError(t, err)
			require.True(t, bytes.Equal(data, got), f)
		}
	})

	t.Run("labels and RBAC at the proxy", func(t *testing.T) {
		// bob has the login, but his role reaches env=prod only: the
		// proxy neither lists nor routes to the env=it server, and tells
		// him it does not exist; the audit log says why.
		createRole(t, c.dataDir, fmt.Sprintf("kind: role\nmetadata: {name: prod-only}\nspec:\n  logins: [%s]\n  node_labels: {env: prod}\n", c.login))
		mustPctl(t, c.dataDir, "bob's password 1\n", "users", "add", "bob", "--logins", c.login, "--roles", "prod-only")
		eb := newPshEnv(t, c)
		eb.login(t, "bob", "bob's password 1\n")
		require.NotContains(t, eb.mustRun(t, "", "ls"), "legacy")
		_, errOut, code := eb.run(t, "", "ssh", "legacy", "echo reached")
		require.Equal(t, 255, code, errOut)
		require.Contains(t, errOut, `node "legacy" not found`)
		require.NotContains(t, errOut, "offline")
		var last string
		require.Eventually(t, func() bool {
			last = mustPctl(t, c.dataDir, "", "events", "ls", "--type", "access.denied", "--format", "json")
			for _, l := range strings.Split(last, "\n") {
				if strings.Contains(l, `"user":"bob"`) && strings.Contains(l, `"target":"legacy`) {
					return true
				}
			}
			return false
		}, 20*time.Second, 100*time.Millisecond, "access.denied: %s", last)
		// alice's role reaches it: listed, with its kind and health.
		ls := e.mustRun(t, "", "ls", "--format", "json")
		require.Regexp(t, `"hostname": "legacy",[^}]*}[^}]*"kind": "openssh",\s*"status": "online"`, ls)
	})

	t.Run("sshd refuses a login the roles do not allow", func(t *testing.T) {
		// Straight to sshd, no proxy: its principal check is all there is.
		direct := func(login string) (string, error) {
			_, port, err := net.SplitHostPort(d.Addr)
			require.NoError(t, err)
			cmd := exec.Command("ssh", "-F", "/dev/null", "-p", port, "-i", c.keyPath, "-o", "CertificateFile="+c.keyPath+"-cert.pub",
				"-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile="+c.keyPath+".known_hosts", "-o", "GlobalKnownHostsFile=/dev/null",
				"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "PreferredAuthentications=publickey",
				login+"@127.0.0.1", "echo direct")
			o, err := output(cmd)
			return string(o), err
		}
		o, err := direct(c.login)
		require.NoError(t, err, "the allowed login, as a check of the setup: %s", o)
		require.Equal(t, "direct\n", o)
		o, err = direct("nobody")
		require.Error(t, err)
		require.Contains(t, err.Error(), "Permission denied")
		require.Empty(t, o)
	})

	t.Run("web terminal recorded at the proxy", func(t *testing.T) {
		checkOpenSSHWebTerminal(t, c, e)
	})

	t.Run("offline and back", func(t *testing.T) {
		d.Stop()
		var last string
		require.Eventually(t, func() bool {
			_, errOut, code := e.run(t, "", "ssh", "legacy", "true")
			last = errOut
			return code == 255 && strings.Contains(errOut, `node "legacy" is offline: its SSH server does not answer`)
		}, 60*time.Second, 250*time.Millisecond, "last try: %s", last)
		// The proxy's next heartbeat carries what its checker found.
		statusRe := func(status string) *regexp.Regexp {
			return regexp.MustCompile(`(?m)^legacy +.* +openssh +` + status + `$`)
		}
		require.Eventually(t, func() bool {
			last = mustPctl(t, c.dataDir, "", "nodes", "ls")
			return statusRe("offline").MatchString(last)
		}, 60*time.Second, 250*time.Millisecond, "pctl nodes ls: %s", last)
		d.Start(t)
		waitPshSSH("psh ssh after sshd came back")
		require.Eventually(t, func() bool {
			last = mustPctl(t, c.dataDir, "", "nodes", "ls")
			return statusRe("online").MatchString(last)
		}, 60*time.Second, 250*time.Millisecond, "pctl nodes ls: %s", last)
	})

	t.Run("rotate-openssh", func(t *testing.T) {
		out2 := filepath.Join(t.TempDir(), "rotated")
		// The server presents this cluster's certificate: its key is taken
		// without a question (no stdin).
		stdout := mustPctl(t, c.dataDir, "", "nodes", "rotate-openssh", "legacy", "--out", out2)
		require.Contains(t, stdout, "reissuing it for that key")
		certBytes, err := os.ReadFile(filepath.Join(out2, "ssh_host_cert"))
		require.NoError(t, err)
		pub, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
		require.NoError(t, err)
		rotated := pub.(*ssh.Certificate)
		require.Equal(t, d.HostKey.Marshal(), rotated.Key.Marshal())
		require.NotEqual(t, cert.Serial, rotated.Serial)
	})

	t.Run("audited", func(t *testing.T) {
		// The backend follows the event log asynchronously.
		var last string
		require.Eventually(t, func() bool {
			last = mustPctl(t, c.dataDir, "", "events", "ls", "--type", "node.create", "--format", "json")
			return strings.Contains(last, `"server_hostname":"legacy"`) && strings.Contains(last, fp)
		}, 20*time.Second, 100*time.Millisecond, "node.create: %s", last)
		require.Eventually(t, func() bool {
			last = mustPctl(t, c.dataDir, "", "events", "ls", "--type", "node.rotate", "--format", "json")
			return strings.Contains(last, `"server_hostname":"legacy"`)
		}, 20*time.Second, 100*time.Millisecond, "node.rotate: %s", last)
	})

	t.Run("rm", func(t *testing.T) {
		require.Contains(t, mustPctl(t, c.dataDir, "", "nodes", "rm", "legacy"), "removed")
		require.NotContains(t, mustPctl(t, c.dataDir, "", "nodes", "ls"), "legacy")
		var last string
		require.Eventually(t, func() bool {
			_, errOut, code := e.run(t, "", "ssh", "legacy", "true")
			last = errOut
			return code == 255 && strings.Contains(errOut, `node "legacy" not found`)
		}, 20*time.Second, 100*time.Millisecond, "last try: %s", last)
	})
}
