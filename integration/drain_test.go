package integration

import (
	"bufio"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/service"
)

// TestProxySIGTERMDrains: SIGTERM on a proxy process closes its SSH and
// web ports at once (new connections are refused, so a client moves to
// another proxy), lets the session already open through it run to its
// end, and exits 0; the other proxy serves new sessions meanwhile.
func TestProxySIGTERMDrains(t *testing.T) {
	c := newAllInOne(t)
	d := startProxyDaemon(t, c.dataDir, c.p, "edge-drain")
	cfg := c.clientConfig(t)

	// Real OpenSSH, so that the jump connection ends with the session
	// as it does for users.
	requireOpenSSH(t, "ssh")
	daddr, err := net.ResolveTCPAddr("tcp", d.sshAddr)
	require.NoError(t, err)
	ocfg := c.opensshConfigVia(t, daddr, c.hostname)
	cmd := exec.Command("ssh", "-F", ocfg, c.hostname, "echo started; sleep 2; echo drained")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var errOut syncBuffer
	cmd.Stderr = &errOut
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewReader(stdout)
	line, err := lines.ReadString('\n')
	require.NoError(t, err, errOut.String())
	require.Equal(t, "started\n", line)

	require.NoError(t, d.node.cmd.Process.Signal(syscall.SIGTERM))
	refused := func(addr string) bool {
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		nc.Close()
		return false
	}
	require.Eventually(t, func() bool { return refused(d.sshAddr) && refused(d.webAddr) }, 5*time.Second, 20*time.Millisecond,
		"the draining proxy still accepts connections")

	// The untouched proxy takes the new sessions.
	other, err := jumpVia(t, cfg, c.p.Addr(service.ListenerProxySSH).String(), c.hostname+":0")
	require.NoError(t, err)
	out, err := run(t, other, "echo elsewhere")
	require.NoError(t, err)
	require.Equal(t, "elsewhere\n", out)

	// The open session ends by itself, whole.
	rest, err := lines.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "drained\n", rest)
	require.NoError(t, cmd.Wait(), errOut.String())

	ended := time.Now()
	select {
	case err := <-d.node.done:
		t.Logf("exited %v after the last session ended", time.Since(ended))
		d.node.done <- err
		require.NoError(t, err, "exit status after SIGTERM: %s", d.node.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("the proxy did not exit after its sessions drained")
	}
	require.NotContains(t, strings.ToLower(d.node.stderr.String()), "panic")
}
