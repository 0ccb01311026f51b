package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/utils"
)

// newAllInOneWith is newAllInOne with a hook to change the config (the
// backend, say) before the process starts.
func newAllInOneWith(t testing.TB, mutate func(*config.Config)) *allInOne {
	t.Helper()
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleAuth, config.RoleProxy, config.RoleNode)
	cfg.NodeName = "node-1"
	cfg.Labels = map[string]string{"env": "it"}
	mutate(cfg)
	p := startProcess(t, cfg)
	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, dir, "correct horse battery\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, dir, "", "auth", "sign", "--user", "alice", "--ttl", "10m", "--out", keyPath)
	waitNodes(t, adminClient(t, dir, p), 1)
	return &allInOne{p: p, dataDir: dir, login: u.Username, hostname: "node-1", keyPath: keyPath}
}

// lineSession is a remote `sh` fed line by line: a session that stays
// open while the test runs commands in it.
type lineSession struct {
	s   *ssh.Session
	in  io.WriteCloser
	out *bufio.Reader
}

func startLineSession(t *testing.T, clt *ssh.Client, cmd string) *lineSession {
	t.Helper()
	s, err := clt.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	in, err := s.StdinPipe()
	require.NoError(t, err)
	out, err := s.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, s.Start(cmd))
	return &lineSession{s: s, in: in, out: bufio.NewReader(out)}
}

// roundTrip writes line and reads one line back, bounded by a deadline so
// that a dead session fails the test instead of hanging it.
func (ls *lineSession) roundTrip(line string) (string, error) {
	type result struct {
		s   string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		if _, err := io.WriteString(ls.in, line+"\n"); err != nil {
			ch <- result{err: err}
			return
		}
		s, err := ls.out.ReadString('\n')
		ch <- result{s, err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-time.After(20 * time.Second):
		ls.s.Close() // unblocks the goroutine
		r := <-ch
		return r.s, fmt.Errorf("no answer within 20s (then: %v)", r.err)
	}
}

// waitErr waits for ch, bounded.
func waitErr(t *testing.T, ch <-chan error, within time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(within):
		t.Fatalf("%s: nothing within %v", what, within)
		return nil
	}
}

// TestFaultNodeKilledMidSession: a node dies under an open ssh -J session.
// The client learns promptly, and the proxy goes on serving other nodes.
func TestFaultNodeKilledMidSession(t *testing.T) {
	c := newAllInOne(t)
	out := mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	cfg2 := procConfig(t.TempDir(), config.RoleNode)
	cfg2.AuthServer, cfg2.Token, cfg2.CAPin, cfg2.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], "second"
	b := startProcess(t, cfg2)
	waitNodes(t, adminClient(t, c.dataDir, c.p), 2)

	// The proxy's NodeWatcher learns of the node through its watch.
	var second *ssh.Client
	require.Eventually(t, func() bool {
		var err error
		second, err = c.viaJump(t, "second:0")
		return err == nil
	}, 20*time.Second, 50*time.Millisecond)
	ls := startLineSession(t, second, "cat")
	got, err := ls.roundTrip("ping")
	require.NoError(t, err)
	require.Equal(t, "ping\n", got)

	waited := make(chan error, 1)
	go func() { waited <- ls.s.Wait() }()
	// A kill, not a drain: the context is already done, so Shutdown
	// force-closes the session at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	_ = b.Shutdown(ctx) // ctx is done: it reports that draining was cut short
	err = waitErr(t, waited, 10*time.Second, "the session's end")
	require.Error(t, err, "a session on a dead node cannot end cleanly")
	require.Less(t, time.Since(start), 10*time.Second)
	t.Logf("client saw: %v after %v", err, time.Since(start))

	// The proxy is unaffected: the first node still works, through the
	// same proxy, and the dead one gives a clear error instead of a hang.
	clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
	require.NoError(t, err)
	got, err = run(t, clt, "echo alive")
	require.NoError(t, err)
	require.Equal(t, "alive\n", got)
	start = time.Now()
	_, err = c.viaJump(t, "second:0")
	require.Error(t, err)
	require.Less(t, time.Since(start), 15*time.Second)
	t.Logf("new session to the dead node: %v", err)
}

// postCerts logs in over POST /webapi/ssh/certs; it returns the status and
// the body.
func postCerts(t *testing.T, hc *http.Client, webAddr, user, password string) (int, string, error) {
	t.Helper()
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	body := fmt.Sprintf(`{"user":%q,"password":%q,"otp_token":"","pub_key":%q,"ttl_seconds":600}`, user, password, strings.TrimSpace(string(pub)))
	resp, err := hc.Post("https://"+webAddr+"/webapi/ssh/certs", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), nil
}

// TestFaultBackendOutage runs the cluster on etcd and takes etcd away:
// sessions already open carry on, new logins fail with a clear error in
// bounded time, and everything recovers once etcd is back.
func TestFaultBackendOutage(t *testing.T) {
	etcd := etcdtest.Start(t)
	c := newAllInOneWith(t, func(cfg *config.Config) {
		cfg.Backend = config.BackendConfig{Type: config.BackendEtcd, EtcdEndpoints: etcd.Endpoints, EtcdPrefix: "/faults"}
	})
	hc := c.webClient(t)
	webAddr := c.p.Addr(service.ListenerWeb).String()
	status, body, err := postCerts(t, hc, webAddr, "alice", "correct horse battery")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, body)

	clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
	require.NoError(t, err)
	ls := startLineSession(t, clt, "sh")
	got, err := ls.roundTrip("echo before")
	require.NoError(t, err)
	require.Equal(t, "before\n", got)

	etcd.Stop()

	got, err = ls.roundTrip("echo during")
	require.NoError(t, err, "an open session must not depend on the backend")
	require.Equal(t, "during\n", got)

	// The login, and everything else (pctl, psh, the web API, SSH: a
	// banner instead of a bare "Permission denied"), say so, in parallel
	// so that the outage stays short.
	requireAuthUnavailableEverywhere(t, c, func(t *testing.T) {
		start := time.Now()
		status, body, err := postCerts(t, hc, webAddr, "alice", "correct horse battery")
		elapsed := time.Since(start)
		t.Logf("login during the outage: %d %s (err %v) after %v", status, body, err, elapsed)
		require.NoError(t, err, "the web server must answer, not hang up")
		require.Equal(t, http.StatusServiceUnavailable, status, "a backend outage is the server's trouble, not bad credentials: %s", body)
		require.Contains(t, body, "the auth server is unavailable; try again later")
		require.Less(t, elapsed, 20*time.Second, "a login must fail in bounded time")
	})

	start := time.Now()
	etcd.Restart(t)
	t.Logf("etcd back after %v", time.Since(start))

	require.Eventually(t, func() bool {
		status, _, err := postCerts(t, hc, webAddr, "alice", "correct horse battery")
		return err == nil && status == http.StatusOK
	}, 30*time.Second, 200*time.Millisecond, "logins recover once etcd is back")
	t.Logf("logins recovered %v after the restart began", time.Since(start))
	got, err = ls.roundTrip("echo after")
	require.NoError(t, err)
	require.Equal(t, "after\n", got)
	// The proxy's view of the inventory recovered too: a new session
	// routes and the admin API writes again. (The node's record may have
	// expired during the outage, 30 s TTL: its next heartbeat, within
	// 10 s, brings it back.)
	var clt2 *ssh.Client
	require.Eventually(t, func() bool {
		clt2, err = c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
		return err == nil
	}, 20*time.Second, 200*time.Millisecond, "the node routes again")
	got, err = run(t, clt2, "echo new")
	require.NoError(t, err)
	require.Equal(t, "new\n", got)
	mustPctl(t, c.dataDir, "password-zed\n", "users", "add", "zed", "--logins", c.login)
}

// TestFaultConnectionFlood holds hundreds of silent TCP connections and
// sprays garbage at the proxy SSH, node SSH and web ports; a legitimate
// user still gets in while it lasts, and garbage is dropped.
func TestFaultConnectionFlood(t *testing.T) {
	c := newAllInOne(t)
	addrs := map[string]string{
		"proxy ssh": c.p.Addr(service.ListenerProxySSH).String(),
		"node ssh":  c.p.Addr(service.ListenerNode).String(),
		"web":       c.p.Addr(service.ListenerWeb).String(),
	}
	const silent, noisy = 200, 20
	var held []net.Conn
	t.Cleanup(func() {
		for _, conn := range held {
			conn.Close()
		}
	})
	garbage := bytes.Repeat([]byte("\x16\x03\x01\xff\xfegarbage\x00\x01"), 4096) // no newline: never a version line
	var noisyConns []net.Conn
	for name, addr := range addrs {
		for i := 0; i < silent; i++ {
			conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
			require.NoError(t, err, "%s: silent connection %d", name, i)
			held = append(held, conn)
		}
		for i := 0; i < noisy; i++ {
			conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
			require.NoError(t, err, "%s: noisy connection %d", name, i)
			held = append(held, conn)
			noisyConns = append(noisyConns, conn)
			_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
			_, _ = conn.Write(garbage) // the server may hang up mid-write: fine
		}
	}

	// With all of that open, a real user gets a shell and the web answers.
	clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
	require.NoError(t, err)
	out, err := run(t, clt, "echo still-serving")
	require.NoError(t, err)
	require.Equal(t, "still-serving\n", out)
	resp, err := c.webClient(t).Get("https://" + addrs["web"] + "/webapi/ping")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// Garbage is not kept: every noisy connection is closed by the server.
	for i, conn := range noisyConns {
		_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		_, err := io.Copy(io.Discard, conn)
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "noisy connection %d to %s still open", i, conn.RemoteAddr())
	}

	select {
	case err := <-c.p.Errors():
		t.Fatalf("the process reported an error under the flood: %v", err)
	default:
	}
}

// TestFaultSlowReader: a session pours output at a client that never reads.
// SSH flow control (channel windows on both legs) must stop the flow, so
// neither the proxy nor the node buffers without bound; when the client
// leaves, the remote process and the session end.
func TestFaultSlowReader(t *testing.T) {
	c := newAllInOne(t)
	clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
	require.NoError(t, err)
	s, err := clt.NewSession()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	markerBytes := make([]byte, 8)
	_, err = rand.Read(markerBytes)
	require.NoError(t, err)
	marker := "postern-slow-reader-" + hex.EncodeToString(markerBytes)
	require.NoError(t, s.Start("exec yes "+marker))
	// It flows: read a little, then stop reading.
	_, err = io.CopyN(io.Discard, stdout, 1<<20)
	require.NoError(t, err)
	require.NotEmpty(t, pidsWith(t, marker))

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// A fixed stall: without flow control `yes` produces hundreds of MB/s,
	// so two seconds would be far beyond the bound.
	time.Sleep(2 * time.Second)
	runtime.GC()
	runtime.ReadMemStats(&after)
	const bound = 64 << 20
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap before %d MiB, after %d MiB", before.HeapAlloc>>20, after.HeapAlloc>>20)
	require.Less(t, grew, int64(bound), "heap grew by %d bytes while the client did not read", grew)

	// The client leaves without reading: the session and `yes` end.
	s.Close()
	clt.Close()
	require.Eventually(t, func() bool { return len(pidsWith(t, marker)) == 0 }, 20*time.Second, 50*time.Millisecond,
		"the remote process outlived its session")
}

// pidsWith lists processes whose command line contains marker.
func pidsWith(t *testing.T, marker string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(cmdline, []byte(marker)) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}
