package integration

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// TestIdleJumpToStoppedTunnelNode: an idle OpenSSH `ssh -J` session to a
// node in a network namespace, reached only over its tunnel, whose process
// is then SIGSTOPped: its kernel keeps every socket open and silent, so
// nothing but the proxy's keep-alives can tell. The proxy drops the tunnel
// after keep_alive_interval x keep_alive_count_max (1s x 2 here), and the
// session must end with it, with the client saying why, not hang until
// someone types (the proxy's quiet splice of the session once waited for
// an event its own close of the connection never sends).
func TestIdleJumpToStoppedTunnelNode(t *testing.T) {
	requireOpenSSH(t, "ssh")
	const interval, count, margin = time.Second, 2, 5 * time.Second
	ns := newNetNS(t)
	c := newNATCluster(t, ns)
	clt := adminClient(t, c.dataDir, c.p)
	require.NoError(t, clt.SetClusterNetworkingConfig(context.Background(), &services.ClusterNetworkingConfig{
		Spec: services.ClusterNetworkingConfigSpec{KeepAliveInterval: services.Duration(interval), KeepAliveCountMax: count},
	}))
	n, _ := startNSNode(t, ns, c, clt, "sleepy")
	waitTunnels(t, c.p, 1, 20*time.Second, "the tunnel comes up")
	waitLog(t, n.stderr, "keep_alive_interval=1s", 0, 20*time.Second, "the node hears the short keep-alives")

	// LogLevel INFO: OpenSSH says why a connection ended at that level.
	ssh := exec.Command("ssh", "-F", c.natSSHConfig(t, "sleepy"), "-o", "LogLevel=INFO", "sleepy", "echo ready; exec sleep 600")
	stderr := &syncBuffer{}
	ssh.Stderr = stderr
	// Its own process group, so that a failed run can kill the ProxyJump
	// child too (it holds stderr open), and Wait does not wait for it.
	ssh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	ssh.WaitDelay = 2 * time.Second
	stdout, err := ssh.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, ssh.Start())
	exited := make(chan error, 1)
	go func() { exited <- ssh.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-ssh.Process.Pid, syscall.SIGKILL)
		err := <-exited
		exited <- err
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr)
	require.Equal(t, "ready\n", line)
	require.Equal(t, 1.0, metric(getMetrics(t, c.p), `postern_tunnel_transports_total{path="data_connection"}`),
		"the session rides a data connection of its own, as a tunnel node's sessions do")
	// The attack needs an idle session: the (in-process) proxy's splice
	// of the data connection has parked a quiet direction.
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer pcancel()
	require.NoError(t, utils.WaitParkedSplices(pctx, 1), "the idle session's splice never parked")

	t.Cleanup(func() { _ = n.cmd.Process.Signal(syscall.SIGCONT) })
	require.NoError(t, n.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	bound := interval*count + margin
	select {
	case err = <-exited:
		exited <- err
	case <-time.After(bound):
		t.Fatalf("the idle ssh -J session outlived its stopped node's tunnel by more than %v; stderr: %s", margin, stderr)
	}
	took := time.Since(stopped)
	t.Logf("the session ended %v after SIGSTOP; stderr: %q", took, stderr)
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "ssh failed: %v", err)
	require.Equal(t, 255, ee.ExitCode(), "ssh's own failure, not the remote command's")
	// Which of the two OpenSSH prints depends on whether it read the end
	// or wrote into it first; a direct-tcpip channel carries no text of
	// the proxy's, and the session inside is end-to-end.
	require.Regexp(t, `closed by remote host|send disconnect: Broken pipe`, stderr.String(), "the client says the connection ended")
	require.GreaterOrEqual(t, took, interval, "not before the keep-alives could have failed")
	waitTunnels(t, c.p, 0, time.Second, "the proxy dropped the tunnel")
}
