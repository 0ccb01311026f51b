package integration

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/service"
)

// readScreenUntil reads terminal frames until the output matches re; an
// error frame or the socket's end fails the test.
func readScreenUntil(t *testing.T, ctx context.Context, ws *websocket.Conn, re *regexp.Regexp) {
	t.Helper()
	var screen strings.Builder
	for {
		_, msg, err := ws.Read(ctx)
		require.NoError(t, err, "screen so far: %q", screen.String())
		f, err := webterm.DecodeFrame(msg)
		require.NoError(t, err)
		switch f.Type {
		case webterm.FrameError:
			t.Fatalf("terminal error: %s", f.Payload)
		case webterm.FrameData:
			_, data, err := webterm.DecodeSeq(f.Payload)
			require.NoError(t, err)
			screen.Write(data)
		}
		if re.MatchString(screen.String()) {
			return
		}
	}
}

// TestProxySIGTERMDrainsWebTerminals: SIGTERM on a proxy process drains
// its web terminals as it drains SSH sessions, within shutdown_grace (4s
// here). The web port refuses new connections at once; a terminal open
// through it goes on (it runs a command typed after the SIGTERM, and its
// shell's exit ends it normally, with no error); one still open when the
// grace ends is closed then, not before, with an error frame that says
// why; a detached one ends at once (nobody can resume it here); and the
// process exits.
func TestProxySIGTERMDrainsWebTerminals(t *testing.T) {
	const grace = 4 * time.Second
	c := newAllInOne(t)
	m := joinRe.FindStringSubmatch(mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	d := &proxyDaemon{dataDir: t.TempDir()}
	port := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	d.sshAddr, d.webAddr, d.tunAddr, d.diagAddr = port(), port(), port(), port()
	cfgFile := filepath.Join(t.TempDir(), "postern.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte("shutdown_grace: "+grace.String()+"\n"), 0o600))
	d.args = []string{"start", "--config", cfgFile, "--roles", "proxy", "--data-dir", d.dataDir, "--nodename", "edge-drain",
		"--auth-server", c.p.Addr(service.ListenerAuth).String(),
		"--ssh-addr", d.sshAddr, "--web-addr", d.webAddr, "--tunnel-addr", d.tunAddr, "--diag-addr", d.diagAddr, "--peer-addr", port()}
	d.start(t, "--token", m[1], "--ca-pin", m[2])

	// Logged in through the all-in-one; the session is in the backend.
	b := browserAt(t, webTermLogin(t, c), d.webAddr, d.dataDir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	short, _, _ := b.open(t, ctx, c, "", "echo ONE-$((1+1))\n", regexp.MustCompile(`ONE-2`))
	long, _, _ := b.open(t, ctx, c, "", "echo TWO-$((2+2))\n", regexp.MustCompile(`TWO-4`))
	// A detached terminal (its socket gone, waiting for a resume) cannot
	// be resumed on a proxy whose port is closed: it ends at once.
	detached, _, pidMatch := b.open(t, ctx, c, "", "echo PID-$$-END\n", regexp.MustCompile(`PID-(\d+)-END`))
	pid, err := strconv.Atoi(pidMatch[1])
	require.NoError(t, err)
	detached.CloseNow()

	require.NoError(t, d.node.cmd.Process.Signal(syscall.SIGTERM))
	termed := time.Now()
	require.Eventually(t, func() bool {
		nc, err := net.DialTimeout("tcp", d.webAddr, time.Second)
		if err != nil {
			return true
		}
		nc.Close()
		return false
	}, 5*time.Second, 20*time.Millisecond, "the draining proxy's web port still accepts connections")

	require.Eventually(t, func() bool { return !processAlive(pid) }, grace/2, 20*time.Millisecond,
		"the detached terminal's shell (pid %d) is still there", pid)
	t.Logf("detached: shell gone %v after SIGTERM", time.Since(termed))

	// Both attached terminals are still alive after the port closed: they run
	// what is typed now.
	for name, ws := range map[string]*websocket.Conn{"short": short, "long": long} {
		require.NoError(t, ws.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameData, []byte("echo AFTER-$((40+2))\n"))))
		readScreenUntil(t, ctx, ws, regexp.MustCompile(`AFTER-42`))
		t.Logf("%s: ran a command %v after SIGTERM", name, time.Since(termed))
	}
	require.Less(t, time.Since(termed), grace, "the test must check the drain within the grace")

	// The short one ends by itself, normally.
	require.NoError(t, short.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameData, []byte("exit\n"))))
	require.Empty(t, requireTerminalEnds(t, short, "the terminal whose shell exited"), "a shell's exit is no error")

	// The long one is closed at the end of the grace, with the reason.
	reason := requireTerminalEnds(t, long, "the terminal still open at the end of the grace")
	closed := time.Since(termed)
	t.Logf("long: closed %v after SIGTERM: %q", closed, reason)
	require.GreaterOrEqual(t, closed, grace-500*time.Millisecond, "closed before the grace ended")
	require.Contains(t, reason, "shutdown grace")

	select {
	case err := <-d.node.done:
		d.node.done <- err
		t.Logf("exited %v after SIGTERM: %v", time.Since(termed), err)
	case <-time.After(20 * time.Second):
		t.Fatal("the proxy did not exit after its grace")
	}
	require.NotContains(t, strings.ToLower(d.node.stderr.String()), "panic")
}
