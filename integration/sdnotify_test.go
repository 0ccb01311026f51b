package integration

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSystemdNotify runs `postern start` as a Type=notify systemd unit
// would: $NOTIFY_SOCKET names a unixgram socket the test listens on. READY=1
// comes only once every listener accepts; SIGHUP is a reload (RELOADING=1,
// then READY=1; debug and log_format applied, other changed keys named as
// needing a restart, an invalid file refused) and never ends the process;
// SIGTERM sends STOPPING=1 and the process exits cleanly.
func TestSystemdNotify(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	require.NoError(t, err)
	defer conn.Close()
	recv := func(what string) string {
		t.Helper()
		buf := make([]byte, 4096)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(60*time.Second)))
		n, err := conn.Read(buf)
		require.NoError(t, err, "waiting for %s", what)
		return string(buf[:n])
	}

	port := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	addrs := map[string]string{
		"auth_addr": port(), "ssh_addr": port(), "web_addr": port(), "tunnel_addr": port(),
		"peer_addr": port(), "node_addr": port(), "diag_addr": port(),
	}
	cfgPath := filepath.Join(dir, "postern.yaml")
	writeConfig := func(extra string) {
		var b strings.Builder
		fmt.Fprintf(&b, "data_dir: %s\nroles: [auth, proxy, node]\nnodename: notify-1\n", filepath.Join(dir, "data"))
		for k, v := range addrs {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
		b.WriteString(extra)
		require.NoError(t, os.WriteFile(cfgPath, []byte(b.String()), 0o600))
	}
	writeConfig("")

	stderr := &syncBuffer{}
	cmd := exec.Command(bin("postern"), "start", "-c", cfgPath)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})

	msg := recv("READY=1")
	require.True(t, strings.HasPrefix(msg, "READY=1\n"), "first notice: %q\n%s", msg, stderr)
	require.Contains(t, msg, "STATUS=Serving: roles auth,proxy,node")
	for name, addr := range addrs {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		require.NoError(t, err, "%s accepts once READY=1 is sent", name)
		c.Close()
	}
	resp, err := http.Get("http://" + addrs["diag_addr"] + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// A reload: debug and log_format apply, cluster_name needs a restart.
	writeConfig("debug: true\nlog_format: json\ncluster_name: renamed\n")
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	msg = recv("RELOADING=1")
	require.True(t, strings.HasPrefix(msg, "RELOADING=1\nMONOTONIC_USEC="), "%q", msg)
	msg = recv("READY=1 after the reload")
	require.True(t, strings.HasPrefix(msg, "READY=1\n"), "%q", msg)
	require.Eventually(t, func() bool {
		s := stderr.String()
		return strings.Contains(s, `"needs_restart":"cluster_name"`) && strings.Contains(s, `"log_format":"json"`)
	}, 10*time.Second, 20*time.Millisecond, "the reload is logged in JSON, naming the key that needs a restart:\n%s", stderr)

	// An invalid file is refused and the process keeps running.
	writeConfig("no_such_key: 1\n")
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.True(t, strings.HasPrefix(recv("RELOADING=1"), "RELOADING=1\n"))
	msg = recv("READY=1 after a refused reload")
	require.Contains(t, msg, "Last reload refused")
	require.Contains(t, msg, "no_such_key")
	select {
	case err := <-done:
		t.Fatalf("postern exited after SIGHUP: %v\n%s", err, stderr)
	case <-time.After(200 * time.Millisecond):
	}

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	msg = recv("STOPPING=1")
	require.True(t, strings.HasPrefix(msg, "STOPPING=1\n"), "%q", msg)
	select {
	case err := <-done:
		require.NoError(t, err, "clean exit on SIGTERM:\n%s", stderr)
		done <- nil
	case <-time.After(60 * time.Second):
		t.Fatalf("postern did not exit on SIGTERM:\n%s", stderr)
	}
}
