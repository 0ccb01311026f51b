package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// daemon is a `postern start` child process on loopback ports.
type daemon struct {
	cmd     *exec.Cmd
	dataDir string
	stderr  *syncBuffer
	done    chan error
}

func startDaemon(t *testing.T, dataDir string, extra ...string) *daemon {
	t.Helper()
	return startDaemonAt(t, dataDir, "127.0.0.1:0", "127.0.0.1:0", extra...)
}

// startDaemonAt is startDaemon with the tunnel and peer ports at
// tunnelAddr and peerAddr, for tests that connect to them.
func startDaemonAt(t *testing.T, dataDir, tunnelAddr, peerAddr string, extra ...string) *daemon {
	t.Helper()
	args := append([]string{"start", "--data-dir", dataDir, "--cluster-name", clusterName,
		"--auth-addr", "127.0.0.1:0", "--node-addr", "127.0.0.1:0", "--ssh-addr", "127.0.0.1:0",
		"--web-addr", "127.0.0.1:0", "--tunnel-addr", tunnelAddr, "--peer-addr", peerAddr, "--diag-addr", "127.0.0.1:0"}, extra...)
	d := &daemon{cmd: exec.Command(bin("postern"), args...), dataDir: dataDir, stderr: &syncBuffer{}, done: make(chan error, 1)}
	d.cmd.Stderr = d.stderr
	require.NoError(t, d.cmd.Start())
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
	})
	// Ready when pctl gets an answer with the admin identity.
	require.Eventually(t, func() bool {
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("postern exited during start-up: %v\n%s", err, d.stderr.String())
		default:
		}
		_, _, err := pctl(t, dataDir, "", "users", "ls")
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)
	return d
}

func TestBrokenConfigIsOneLine(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "postern.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("cluster_name: a\nnodname: typo\n"), 0o600))
	dataDir := filepath.Join(t.TempDir(), "data")
	out, err := exec.Command(bin("postern"), "start", "--config", cfg, "--data-dir", dataDir).CombinedOutput()
	require.Error(t, err)
	msg := strings.TrimSpace(string(out))
	require.NotContains(t, msg, "\n", "one line, no stack trace: %q", msg)
	require.Contains(t, msg, cfg)
	require.Contains(t, msg, "line 2")
	require.Contains(t, msg, "nodname")
	require.NoDirExists(t, dataDir, "nothing was created")
}

func TestUnusableDataDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	out, err := exec.Command(bin("postern"), "start", "--data-dir", filepath.Join(file, "sub"),
		"--auth-addr", "127.0.0.1:0", "--node-addr", "127.0.0.1:0", "--ssh-addr", "127.0.0.1:0",
		"--web-addr", "127.0.0.1:0", "--tunnel-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0", "--diag-addr", "127.0.0.1:0").CombinedOutput()
	require.Error(t, err)
	msg := strings.TrimSpace(string(out))
	require.Contains(t, msg, "data dir "+filepath.Join(file, "sub"))
	require.Contains(t, msg, "not a directory")
	require.Equal(t, 1, strings.Count(msg, "ERROR"))
}

func TestVersionAndHelp(t *testing.T) {
	for _, b := range []string{"postern", "pctl"} {
		out, err := exec.Command(bin(b), "version").CombinedOutput()
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(string(out), b+" "), string(out))
		flag, err := exec.Command(bin(b), "--version").Output()
		require.NoError(t, err)
		require.Equal(t, string(out), string(flag), "--version prints what version does, on stdout")
		out, err = exec.Command(bin(b), "--help").CombinedOutput()
		require.NoError(t, err, string(out))
		require.Contains(t, string(out), "usage: "+b)
	}
}

// TestDaemonSignalsAndCrash: SIGTERM drains and exits 0; SIGKILL in the
// middle of writes loses nothing that was committed.
func TestDaemonSignalsAndCrash(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir)
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		require.NoError(t, err, "exit status after SIGTERM: %s", d.stderr.String())
		d.done <- nil
	case <-time.After(30 * time.Second):
		t.Fatal("postern did not exit after SIGTERM")
	}

	d = startDaemon(t, dir)
	var added []string
	for _, name := range []string{"u1", "u2", "u3", "u4", "u5"} {
		mustPctl(t, dir, "password123\n", "users", "add", name, "--logins", name)
		added = append(added, name)
	}
	// Keep writing while the process is killed.
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			pctl(t, dir, "", "tokens", "add", "--type", "node")
		}
	}()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGKILL))
	<-d.done
	d.done <- nil
	close(stop)
	<-writerDone

	startDaemon(t, dir)
	out := mustPctl(t, dir, "", "users", "ls")
	for _, name := range added {
		require.Contains(t, out, name+" ")
	}
}

func TestBadResourceFileChangesNothing(t *testing.T) {
	c := newAllInOne(t)
	role := filepath.Join(t.TempDir(), "role.yaml")
	require.NoError(t, os.WriteFile(role, []byte("kind: role\nmetadata: {name: broken}\nspec:\n  logins: [x]\n  node_labels: {env: '^[a-$'}\n"), 0o600))
	_, errOut, err := pctl(t, c.dataDir, "", "create", "-f", role)
	require.Error(t, err)
	require.Contains(t, errOut, "node_labels")
	require.NotContains(t, strings.TrimSpace(errOut), "\n")
	out := mustPctl(t, c.dataDir, "", "roles", "ls")
	require.NotContains(t, out, "broken")

	require.NoError(t, os.WriteFile(role, []byte("kind: role\nmetadata: {name: typo}\nspec:\n  lgins: [x]\n"), 0o600))
	_, errOut, err = pctl(t, c.dataDir, "", "create", "-f", role)
	require.Error(t, err)
	require.Contains(t, errOut, role+":4")
}

// TestOpenDataDirIsRestricted: a data dir other users can enter would hand
// them the admin identity pctl uses. The daemon restricts it to its owner
// and says so, instead of running with it open.
func TestOpenDataDirIsRestricted(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.Mkdir(dataDir, 0o755))
	require.NoError(t, os.Chmod(dataDir, 0o755)) // whatever the umask
	d := startDaemon(t, dataDir)
	st, err := os.Stat(dataDir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())

	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		d.done <- err
	case <-time.After(30 * time.Second):
		t.Fatal("postern did not stop on SIGTERM")
	}
	require.Contains(t, d.stderr.String(), "accessible to other users")
	require.Contains(t, d.stderr.String(), "0755")
}
