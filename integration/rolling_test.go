package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// TestRollingRestartOfProxies: three proxy processes restarted one after
// the other with SIGTERM while a client starts a session every 200ms,
// round-robin over their addresses, alternately to a node with an address
// and to a node in a network namespace reached only over tunnels (one to
// each proxy, the agent pool). A client that finds a proxy not accepting
// (refused, or reset before the proxy's SSH handshake: nothing was
// started) takes the next address, as it would behind a round-robin
// name. Every session must succeed; a long session through a proxy that
// is not restarted at that moment goes on throughout.
func TestRollingRestartOfProxies(t *testing.T) {
	ns := newNetNS(t)
	authDir := t.TempDir()
	a := startProcess(t, procConfig(authDir, config.RoleAuth))
	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, authDir, alicePassword+"\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, authDir, "", "auth", "sign", "--user", "alice", "--ttl", "10m", "--out", keyPath)
	c := &allInOne{p: a, dataDir: authDir, login: u.Username, keyPath: keyPath}
	cfg := c.clientConfig(t)
	clt := adminClient(t, authDir, a)

	token, pin := nodeToken(t, authDir)
	ncfg := procConfig(t.TempDir(), config.RoleNode)
	ncfg.AuthServer, ncfg.Token, ncfg.CAPin, ncfg.NodeName = a.Addr(service.ListenerAuth).String(), token, pin, "plain"
	startProcess(t, ncfg)

	var proxies []*proxyDaemon
	for i := range 3 {
		proxies = append(proxies, startNSProxyDaemon(t, authDir, a, fmt.Sprintf("edge-%d", i), ns.hostIP))
	}
	waitProxies(t, clt, 3)
	rec, nn := startNSNodeVia(t, ns, authDir, proxies[0].webAddr, clt, "natted")
	var holders []string
	require.Eventually(t, func() bool { holders = leaseHolders(t, clt, rec.UUID); return len(holders) == 3 }, 30*time.Second, 100*time.Millisecond,
		"the node has a tunnel to every proxy, not just %v; its log:\n%s", &holders, nn.stderr)
	waitNodes(t, clt, 2)

	targets := []string{"plain:0", "natted:0"}
	// session starts one session at proxy i (mod 3), moving on while a
	// proxy is not accepting.
	session := func(i int, target string) error {
		var last error
		for k := range len(proxies) {
			addr := proxies[(i+k)%len(proxies)].sshAddr
			nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				last = err
				continue
			}
			pc, chans, reqs, err := ssh.NewClientConn(nc, addr, cfg)
			if err != nil {
				// Reset before the handshake: a connection the draining
				// proxy never accepted.
				nc.Close()
				last = err
				continue
			}
			proxy := ssh.NewClient(pc, chans, reqs)
			defer proxy.Close()
			conn, err := proxy.Dial("tcp", target)
			if err != nil {
				return fmt.Errorf("via %s to %s: %w", addr, target, err)
			}
			sconn, nchans, nreqs, err := ssh.NewClientConn(conn, target, cfg)
			if err != nil {
				return fmt.Errorf("via %s to %s: node handshake: %w", addr, target, err)
			}
			node := ssh.NewClient(sconn, nchans, nreqs)
			defer node.Close()
			s, err := node.NewSession()
			if err != nil {
				return fmt.Errorf("via %s to %s: %w", addr, target, err)
			}
			defer s.Close()
			out, err := s.Output("echo ok")
			if err != nil || string(out) != "ok\n" {
				return fmt.Errorf("via %s to %s: %q %v", addr, target, out, err)
			}
			return nil
		}
		return fmt.Errorf("no proxy accepted: %v", last)
	}

	var (
		mu       sync.Mutex
		started  int
		failures []string
		wg       sync.WaitGroup
	)
	ctx, stop := context.WithCancel(context.Background())
	inFlight := make(chan struct{}, 8)
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// At most inFlight sessions at once: on a loaded machine
			// (CI runs other packages beside this one, under -race)
			// sessions slower than the tick would pile up without bound
			// and starve the in-process auth server the proxies need to
			// become ready again. A skipped tick is not a failure; the
			// count of started sessions is checked below.
			select {
			case inFlight <- struct{}{}:
			default:
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-inFlight }()
				err := session(i, targets[i%len(targets)])
				mu.Lock()
				defer mu.Unlock()
				started++
				if err != nil {
					failures = append(failures, fmt.Sprintf("#%d: %v", i, err))
				}
			}()
		}
	}()

	for i, d := range proxies {
		// A long session through the next proxy, which is not restarted
		// now, must live through this restart.
		other := proxies[(i+1)%len(proxies)]
		long, err := jumpVia(t, cfg, other.sshAddr, "plain:0")
		require.NoError(t, err)
		ls, err := long.NewSession()
		require.NoError(t, err)
		longOut, err := ls.StdoutPipe()
		require.NoError(t, err)
		stdin, err := ls.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, ls.Start("echo up; read x; echo still-up"))
		buf := make([]byte, 3)
		_, err = io.ReadFull(longOut, buf)
		require.NoError(t, err)

		require.NoError(t, d.node.cmd.Process.Signal(syscall.SIGTERM))
		err = <-d.node.done
		d.node.done <- err
		require.NoError(t, err, "proxy %d exit after SIGTERM:\n%s", i, d.node.stderr.String())
		d.start(t)
		// Back in the rotation (d.start waited for /readyz), and the node
		// has a tunnel to it again (the pool) before the next restart.
		require.Eventually(t, func() bool { return len(leaseHolders(t, clt, rec.UUID)) == 3 }, 20*time.Second, 100*time.Millisecond,
			"the node's tunnel to the restarted proxy %d", i)

		_, err = stdin.Write([]byte("\n"))
		require.NoError(t, err)
		rest := make([]byte, len("still-up\n"))
		_, err = io.ReadFull(longOut, rest)
		require.NoError(t, err, "the long session through proxy %d ended during the restart of proxy %d", (i+1)%3, i)
		require.Equal(t, "still-up\n", string(rest))
		require.NoError(t, ls.Wait())
	}
	stop()
	<-loopDone
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d sessions started during the rolling restart", started)
	require.Greater(t, started, 20)
	if len(failures) > 0 {
		for _, l := range strings.Split(nn.stderr.String(), "\n") {
			if strings.Contains(l, "level=warn") || strings.Contains(l, "level=error") {
				t.Logf("node: %s", l)
			}
		}
	}
	require.Empty(t, failures, "failed sessions")
}
