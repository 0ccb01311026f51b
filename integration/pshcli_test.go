package integration

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/proxy"
)

// TestPshRefusalsSayWhy: what psh prints, and its exit status, when it
// cannot run the command: each refusal says why in one line, and psh
// exits 255 as OpenSSH does, keeping the remote status otherwise.
func TestPshRefusalsSayWhy(t *testing.T) {
	c := newAllInOne(t)
	e := newPshEnv(t, c)
	e.login(t, "alice", alicePassword+"\n")
	// bob's roles grant a login this machine does not have.
	mustPctl(t, c.dataDir, "password-bob\n", "users", "add", "bob", "--logins", c.login+",postern-nosuch")
	bob := newPshEnv(t, c)
	bob.login(t, "bob", "password-bob\n")

	t.Run("a login the roles do not allow", func(t *testing.T) {
		_, errOut, code := e.run(t, "", "ssh", "nobody@node-1", "true")
		require.Equal(t, 255, code, errOut)
		requireOneLineError(t, errOut, `login "nobody" is not allowed by your roles (your logins: `+c.login+`)`)
		require.NotContains(t, errOut, "psh login again")
	})

	t.Run("a login missing on the node", func(t *testing.T) {
		_, errOut, code := bob.run(t, "", "ssh", "-l", "postern-nosuch", "node-1", "echo must-not-run")
		require.Equal(t, 255, code, errOut)
		require.Equal(t, "postern: login \"postern-nosuch\" does not exist on this node\r\n", errOut)
	})

	t.Run("a login missing on the node, to OpenSSH", func(t *testing.T) {
		requireOpenSSH(t, "ssh")
		keyPath := filepath.Join(t.TempDir(), "bob")
		mustPctl(t, c.dataDir, "", "auth", "sign", "--user", "bob", "--ttl", "10m", "--out", keyPath)
		bobSSH := *c
		bobSSH.keyPath = keyPath
		cfg := bobSSH.opensshConfig(t, "")
		out, err := exec.Command("ssh", "-F", cfg, "-l", "postern-nosuch", c.hostname, "echo must-not-run").CombinedOutput()
		require.Error(t, err, string(out))
		require.Contains(t, string(out), `login "postern-nosuch" does not exist on this node`)
		require.NotContains(t, string(out), "must-not-run")
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr)
		require.Equal(t, 255, exitErr.ExitCode())
	})

	t.Run("exit status", func(t *testing.T) {
		_, errOut, code := e.run(t, "", "ssh", "node-1", "exit 7")
		require.Equal(t, 7, code, errOut)
		_, errOut, code = e.run(t, "", "ssh", "nope", "true")
		require.Equal(t, 255, code, errOut)
		requireOneLineError(t, errOut, `node "nope" not found`)
	})

	t.Run("-l", func(t *testing.T) {
		out := e.mustRun(t, "", "ssh", "-l", c.login, "node-1", "id -un")
		require.Equal(t, c.login+"\n", out)
		_, errOut, code := e.run(t, "", "ssh", "-l", "other", c.login+"@node-1", "true")
		require.Equal(t, 255, code, errOut)
		requireOneLineError(t, errOut, "two logins given")
	})

	t.Run("--version", func(t *testing.T) {
		v := e.mustRun(t, "", "version")
		require.True(t, strings.HasPrefix(v, "psh "), v)
		require.Equal(t, v, e.mustRun(t, "", "--version"))
		require.Equal(t, v, e.mustRun(t, "", "-V"))
	})
}

// TestPshLockedSaysWhyToOpenSSH: a user locked out learns why from stock
// OpenSSH (default log level) through `ssh -J`, not just "Permission
// denied".
func TestPshLockedSaysWhyToOpenSSH(t *testing.T) {
	requireOpenSSH(t, "ssh")
	c := newAllInOne(t)
	cfg := c.opensshConfig(t, "")
	data, err := os.ReadFile(cfg)
	require.NoError(t, err)
	// OpenSSH's own default log level (INFO): what a user sees.
	require.NoError(t, os.WriteFile(cfg, bytes.ReplaceAll(data, []byte("  LogLevel ERROR\n"), nil), 0o600))
	out, err := exec.Command("ssh", "-F", cfg, "-J", "proxy", c.hostname, "echo ok").CombinedOutput()
	require.NoError(t, err, string(out))

	e := newPshEnv(t, c)
	e.login(t, "alice", alicePassword+"\n")

	mustPctl(t, c.dataDir, "", "lock", "--user", "alice", "--ttl", "1m", "--message", "incident 42")
	const want = "access for user alice is locked: incident 42"
	out, err = exec.Command("ssh", "-F", cfg, "-J", "proxy", c.hostname, "echo must-not-run").CombinedOutput()
	require.Error(t, err, string(out))
	require.Contains(t, string(out), want)
	// psh, and OpenSSH with psh as its ProxyCommand (what `psh config`
	// writes), say the same, not "run psh login again".
	_, errOut, code := e.run(t, "", "ssh", "node-1", "echo must-not-run")
	require.Equal(t, 255, code, errOut)
	requireOneLineError(t, errOut, want)
	require.NotContains(t, errOut, "psh login")
	keyPath := filepath.Join(e.home, "keys", e.webAddr(), "alice")
	ssh := exec.Command("ssh", "-F", "/dev/null", "-o", "ProxyCommand="+bin("psh")+" proxy ssh %r@%h:%p",
		"-o", "IdentityFile="+keyPath, "-o", "CertificateFile="+keyPath+"-cert.pub",
		"-o", "UserKnownHostsFile="+filepath.Join(e.home, "known_hosts"), "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", c.login+"@node-1", "echo must-not-run")
	ssh.Env = e.env()
	out, err = ssh.CombinedOutput()
	require.Error(t, err, string(out))
	require.Contains(t, string(out), want)
	mustPctl(t, c.dataDir, "", "unlock", "--user", "alice")

	mustPctl(t, c.dataDir, "", "lock", "--node", c.hostname, "--message", "maintenance")
	require.Eventually(t, func() bool {
		out, err = exec.Command("ssh", "-F", cfg, "-J", "proxy", c.hostname, "echo must-not-run").CombinedOutput()
		return err != nil
	}, lockWait, 50*time.Millisecond)
	require.Contains(t, string(out), "is locked: maintenance")
}

// TestPshForwardingAndCopy: -N with -D (a SOCKS5 proxy whose connections
// leave from the node, driven by x/net's SOCKS5 client), the ~. escape in
// a pty session, and psh scp both ways.
func TestPshForwardingAndCopy(t *testing.T) {
	c := newAllInOne(t)
	e := newPshEnv(t, c)
	e.login(t, "alice", alicePassword+"\n")

	t.Run("-N -D", func(t *testing.T) {
		echo := startEcho(t)
		port := freePort(t)
		cmd := e.cmd("", "ssh", "-N", "-D", fmt.Sprint(port), "node-1")
		var errOut syncBuffer
		cmd.Stderr = &errOut
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		socks := fmt.Sprintf("127.0.0.1:%d", port)
		require.Eventually(t, func() bool {
			conn, err := net.Dial("tcp", socks)
			if err == nil {
				conn.Close()
			}
			return err == nil
		}, 60*time.Second, 20*time.Millisecond, "-D never listened: %s", errOut.String())
		d, err := proxy.SOCKS5("tcp", socks, nil, proxy.Direct)
		require.NoError(t, err)
		for _, target := range []string{echo, strings.Replace(echo, "127.0.0.1", "localhost", 1)} {
			conn, err := d.Dial("tcp", target)
			require.NoError(t, err, target)
			_, err = conn.Write([]byte("through socks\n"))
			require.NoError(t, err)
			buf := make([]byte, len("through socks\n"))
			_, err = io.ReadFull(conn, buf)
			require.NoError(t, err)
			require.Equal(t, "through socks\n", string(buf))
			conn.Close()
		}
		// A refused destination is a SOCKS failure, not a hang.
		_, err = d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		require.Error(t, err)

		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		select {
		case err := <-exited:
			require.NoError(t, err, "-N ends with 0 on ^C: %s", errOut.String())
		case <-time.After(30 * time.Second):
			t.Fatal("psh -N did not end on SIGINT")
		}

		_, errText, code := e.run(t, "", "ssh", "-N", "node-1", "true")
		require.Equal(t, 255, code)
		requireOneLineError(t, errText, "-N runs no command")
	})

	t.Run("~. disconnects", func(t *testing.T) {
		cmd := e.cmd("", "ssh", "node-1")
		cmd.Stdin = nil
		ptmx, output, readDone := startOnPty(t, cmd, 24, 80)
		var err error
		// A ~. inside a line is typed as is.
		_, err = ptmx.Write([]byte("echo a~.b$((6*7))\r"))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return strings.Contains(output(), "a~.b42") }, 120*time.Second, 20*time.Millisecond, "output: %q", output())
		_, err = ptmx.Write([]byte("\r~."))
		require.NoError(t, err)
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err = <-exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("~. did not disconnect: %q", output())
		}
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, output())
		require.Equal(t, 255, exitErr.ExitCode())
		ptmx.Close()
		<-readDone
		require.Contains(t, output(), "connection closed (~.)")
	})

	t.Run("scp", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "src")
		data := bytes.Repeat([]byte("psh-scp-"), 64*1024)
		require.NoError(t, os.WriteFile(src, data, 0o640))
		remote := filepath.Join(dir, "remote")
		require.NoError(t, os.Mkdir(remote, 0o755))

		e.mustRun(t, "", "scp", src, "node-1:"+filepath.Join(remote, "up"))
		got, err := os.ReadFile(filepath.Join(remote, "up"))
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got))
		st, err := os.Stat(filepath.Join(remote, "up"))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o640), st.Mode().Perm())

		// Into a directory, and back down.
		e.mustRun(t, "", "scp", src, c.login+"@node-1:"+remote)
		require.FileExists(t, filepath.Join(remote, "src"))
		down := filepath.Join(dir, "down")
		e.mustRun(t, "", "scp", "node-1:"+filepath.Join(remote, "up"), down)
		got, err = os.ReadFile(down)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got))

		// -r, both ways.
		tree := filepath.Join(dir, "tree")
		require.NoError(t, os.MkdirAll(filepath.Join(tree, "sub"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(tree, "sub", "f"), []byte("deep"), 0o600))
		_, errOut, code := e.run(t, "", "scp", tree, "node-1:"+remote)
		require.Equal(t, 255, code)
		requireOneLineError(t, errOut, "is a directory (use -r)")
		e.mustRun(t, "", "scp", "-r", tree, "node-1:"+remote)
		got, err = os.ReadFile(filepath.Join(remote, "tree", "sub", "f"))
		require.NoError(t, err)
		require.Equal(t, "deep", string(got))
		back := filepath.Join(dir, "back")
		e.mustRun(t, "", "scp", "-r", "node-1:"+filepath.Join(remote, "tree"), back)
		got, err = os.ReadFile(filepath.Join(back, "sub", "f"))
		require.NoError(t, err)
		require.Equal(t, "deep", string(got))

		_, errOut, code = e.run(t, "", "scp", "node-1:"+filepath.Join(dir, "no-such-file"), down)
		require.Equal(t, 255, code)
		requireOneLineError(t, errOut, "no-such-file")
		_, errOut, code = e.run(t, "", "scp", src, down)
		require.Equal(t, 255, code)
		requireOneLineError(t, errOut, "name a node as [LOGIN@]HOST:PATH")
	})
}
