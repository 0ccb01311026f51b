package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSessionMFAThroughOpenSSH: stock OpenSSH with `psh config`, strict
// host key checking, to a node a require_session_mfa role reaches. The
// config's Match exec asks for a fresh OTP code on the terminal (a real
// pty) before ssh connects, and ssh reaches the node with the
// per-session certificate psh wrote; the file is gone after the session.
// The next ssh asks again, and the code already spent is refused. A
// user whose roles do not require it is not asked.
func TestSessionMFAThroughOpenSSH(t *testing.T) {
	requireOpenSSH(t, "ssh")
	c, code := sessionMFAOn(t, newNamedCluster(t, "mfatest"))
	e := newPshEnv(t, c)
	e.login(t, "dora", "dora password 1\n"+code(0)+"\n")
	cfg := e.mustRun(t, "", "config")
	require.Contains(t, cfg, "--session-mfa %r@%h:%p")
	path := filepath.Join(t.TempDir(), "ssh_config")
	require.NoError(t, os.WriteFile(path, []byte(cfg+"Host *\n    GlobalKnownHostsFile /dev/null\n    BatchMode yes\n    LogLevel ERROR\n"), 0o600))
	target := c.login + "@node-1.mfatest"

	// sshOnPty runs ssh on a terminal, answers the code prompt with
	// answer, and returns what the terminal showed and ssh's error.
	sshOnPty := func(answer, command string) (string, error) {
		cmd := exec.Command("ssh", "-F", path, target, command)
		cmd.Env = withoutEnv(e.env(), "POSTERN_HOME")
		ptmx, out, done := startOnPty(t, cmd, 24, 80)
		require.Eventually(t, func() bool { return strings.Contains(out(), "OTP code") }, 20*time.Second, 20*time.Millisecond, "no prompt: %q", out())
		_, err := ptmx.Write([]byte(answer + "\n"))
		require.NoError(t, err)
		err = cmd.Wait()
		// The pty's reader ends once it has read all ssh printed.
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("the pty did not close: %q", out())
		}
		return out(), err
	}

	screen, err := sshOnPty(code(1), "echo mfa-ok-$SSH_POSTERN_USER")
	require.NoError(t, err, screen)
	require.Contains(t, screen, "mfa-ok-dora", screen)
	left, err := filepath.Glob(filepath.Join(e.home, "session-mfa", "*-cert.pub"))
	require.NoError(t, err)
	require.Empty(t, left, "the per-session certificate is removed once ssh has it")

	// The next ssh asks again; the spent code gets no certificate, and
	// the login's certificate is refused.
	screen, err = sshOnPty(code(1), "echo must-not-run")
	require.Error(t, err, screen)
	require.NotContains(t, screen, "must-not-run")
	require.Contains(t, screen, "no per-session certificate", screen)

	// alice's roles do not require it: no prompt, straight in.
	e2 := newPshEnv(t, c)
	e2.login(t, "alice", alicePassword+"\n")
	path2 := filepath.Join(t.TempDir(), "ssh_config")
	require.NoError(t, os.WriteFile(path2, []byte(e2.mustRun(t, "", "config")+"Host *\n    GlobalKnownHostsFile /dev/null\n    BatchMode yes\n    LogLevel ERROR\n"), 0o600))
	cmd := exec.Command("ssh", "-F", path2, target, "echo plain-ok")
	cmd.Env = withoutEnv(e2.env(), "POSTERN_HOME")
	out, err := output(cmd)
	require.NoError(t, err, string(out))
	require.Equal(t, "plain-ok\n", string(out))
}
