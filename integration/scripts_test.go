package integration

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/freeport"
)

// runOffsets are the ports scripts/run.sh takes from PORT_BASE
// (scripts/ports.sh): diagnostics, peer, node, proxy SSH, tunnel, auth, web.
var runOffsets = []int{0, 21, 22, 23, 24, 25, 80}

// portBase finds a base whose run.sh ports are all free now, below the
// ephemeral range (lib/freeport says why).
func portBase(t *testing.T) int {
	t.Helper()
	for i := 0; i < 50; i++ {
		p := freeport.Port(t)
		base := p - p%100
		if base+100 > 65535 {
			continue
		}
		free := true
		for _, off := range runOffsets {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+off)))
			if err != nil {
				free = false
				break
			}
			ln.Close()
		}
		if free {
			return base
		}
	}
	t.Fatal("no port base with all of run.sh's ports free")
	return 0
}

// holdPort listens on 127.0.0.1:port for the rest of the test, or until
// the returned func is called.
func holdPort(t *testing.T, port int) func() {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return func() { ln.Close() }
}

// scriptCmd runs a script of scripts/ in its own process group, so that
// the test can stop it and everything it started.
func scriptCmd(t *testing.T, script string, env ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(filepath.Join("..", "scripts", script))
	cmd.Env = append(os.Environ(), append([]string{"BUILD_DIR=" + binDir}, env...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	return cmd, out
}

// TestRunScriptPorts: `make run` on a machine where one of its ports is
// busy stops before starting anything, naming the port, what it is for
// and the PORT_BASE knob; on a free base it brings up a cluster that
// answers there, and stops it all on SIGTERM.
func TestRunScriptPorts(t *testing.T) {
	base := portBase(t)
	release := holdPort(t, base+23)
	dataDir := filepath.Join(t.TempDir(), "data")
	env := []string{"DATA_DIR=" + dataDir, "PORT_BASE=" + strconv.Itoa(base)}

	cmd, out := scriptCmd(t, "run.sh", env...)
	err := cmd.Run()
	require.Error(t, err, out.String())
	msg := out.String()
	require.Contains(t, msg, strconv.Itoa(base+23)+" (proxy SSH)")
	require.Contains(t, msg, "make run PORT_BASE=")
	require.NoFileExists(t, filepath.Join(dataDir, "postern.pid"), "nothing was started")

	release()
	cmd, out = scriptCmd(t, "run.sh", env...)
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	})
	exited := false
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			exited = true
			return true
		default:
		}
		return containsAll(out.String(), "Ways in:", "(PORT_BASE="+strconv.Itoa(base)+")")
	}, 60*time.Second, 100*time.Millisecond)
	require.False(t, exited, "run.sh exited:\n%s", out.String())
	require.Contains(t, out.String(), "https://127.0.0.1:"+strconv.Itoa(base+80)+"/")
	// The demo cluster is named after the machine, never "local" (whose
	// `psh config` block would capture every mDNS host).
	require.NotContains(t, out.String(), `cluster "local"`)
	if h, err := os.Hostname(); err == nil {
		h = strings.ToLower(strings.SplitN(h, ".", 2)[0])
		if h != "" && h != "localhost" && strings.Trim(h, "abcdefghijklmnopqrstuvwxyz0123456789-") == "" {
			require.Contains(t, out.String(), `cluster "`+h+`"`)
		}
	}

	// The cluster is on the base's ports: the node heartbeats its address.
	require.Contains(t, mustPctl(t, dataDir, "", "nodes", "ls"), "127.0.0.1:"+strconv.Itoa(base+22))
	for _, off := range runOffsets {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+off)))
		require.NoError(t, err, "port %d", base+off)
		c.Close()
	}

	// SIGTERM to the script (Ctrl-C's path) stops postern too.
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
		done <- nil
	case <-time.After(40 * time.Second):
		t.Fatalf("run.sh did not stop on SIGTERM:\n%s", out.String())
	}
	require.NoFileExists(t, filepath.Join(dataDir, "postern.pid"))
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+23)))
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 10*time.Second, 50*time.Millisecond, "postern still listens after run.sh stopped")
}

// TestRunHAScriptBusyPort: `make run-ha` checks every port before it
// builds, wipes or starts anything, and names the busy one and PORT_BASE.
func TestRunHAScriptBusyPort(t *testing.T) {
	base := portBase(t)
	holdPort(t, base+123) // proxy1's SSH port
	haDir := filepath.Join(t.TempDir(), "ha")
	cmd, out := scriptCmd(t, "run-ha.sh", "HA_DIR="+haDir, "PORT_BASE="+strconv.Itoa(base), "GO=false", "HA_NETNS=0")
	err := cmd.Run()
	require.Error(t, err, out.String())
	require.Contains(t, out.String(), strconv.Itoa(base+123)+" (proxy1 SSH)")
	require.Contains(t, out.String(), "make run-ha PORT_BASE=")
	require.NoDirExists(t, haDir)

	// A base whose ports cannot all fit is refused by name.
	cmd, out = scriptCmd(t, "run-ha.sh", "HA_DIR="+haDir, "PORT_BASE=65000", "GO=false", "HA_NETNS=0")
	require.Error(t, cmd.Run())
	require.Contains(t, out.String(), "PORT_BASE=65000")
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
