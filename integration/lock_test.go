package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/web"
)

// lockWait bounds "within seconds" for a lock or a deletion to reach every
// server of the process and end what it covers.
const lockWait = 10 * time.Second

// bannerDial dials addr (or, with via, through via's direct-tcpip as
// ssh -J does) and returns the client, the banner the server sent, and the
// handshake's error.
func bannerDial(t *testing.T, via *ssh.Client, addr string, cfg *ssh.ClientConfig) (*ssh.Client, string, error) {
	t.Helper()
	cfg.Timeout = 20 * time.Second
	var mu sync.Mutex
	var banner strings.Builder
	cfg.BannerCallback = func(msg string) error {
		mu.Lock()
		defer mu.Unlock()
		banner.WriteString(msg)
		return nil
	}
	var nc net.Conn
	var err error
	if via != nil {
		nc, err = via.Dial("tcp", addr)
	} else {
		nc, err = net.DialTimeout("tcp", addr, cfg.Timeout)
	}
	if err != nil {
		return nil, "", err
	}
	sconn, chans, reqs, err := ssh.NewClientConn(nc, addr, cfg)
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		nc.Close()
		return nil, banner.String(), err
	}
	clt := ssh.NewClient(sconn, chans, reqs)
	t.Cleanup(func() { clt.Close() })
	return clt, banner.String(), nil
}

// openSession is a long-running command on a connection, as a
// ControlMaster keeps one: its stderr is collected, and ended is closed
// when the whole connection ends.
type openSession struct {
	mu     sync.Mutex
	stderr strings.Builder
	ended  chan struct{}
}

func startOpenSession(t *testing.T, clt *ssh.Client) *openSession {
	t.Helper()
	s, err := clt.NewSession()
	require.NoError(t, err)
	stderr, err := s.StderrPipe()
	require.NoError(t, err)
	o := &openSession{ended: make(chan struct{})}
	var copied sync.WaitGroup
	copied.Add(1)
	go func() {
		defer copied.Done()
		b := make([]byte, 1024)
		for {
			n, err := stderr.Read(b)
			o.mu.Lock()
			o.stderr.Write(b[:n])
			o.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	require.NoError(t, s.Start("sleep 600"))
	go func() {
		_ = clt.Wait()
		copied.Wait()
		close(o.ended)
	}()
	return o
}

// requireEnded waits for the connection to end and returns its stderr.
func (o *openSession) requireEnded(t *testing.T, what string) string {
	t.Helper()
	select {
	case <-o.ended:
	case <-time.After(lockWait):
		t.Fatalf("%s: the open connection was not ended within %v", what, lockWait)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stderr.String()
}

// webLogin opens a web session and returns its cookie and token.
func webLogin(t *testing.T, hc *http.Client, webAddr, user, password string) (*http.Cookie, string) {
	t.Helper()
	resp, err := hc.Post("https://"+webAddr+"/webapi/sessions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"user":%q,"password":%q,"otp_token":""}`, user, password)))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var sess webapi.CreateSessionResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&sess))
	for _, ck := range resp.Cookies() {
		if ck.Name == web.SessionCookieName {
			return ck, sess.Token
		}
	}
	t.Fatal("no session cookie")
	return nil, ""
}

// webNodes calls GET /webapi/nodes with a session's cookie and token.
func webNodes(t *testing.T, hc *http.Client, webAddr string, cookie *http.Cookie, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+webAddr+"/webapi/nodes", nil)
	require.NoError(t, err)
	req.AddCookie(&http.Cookie{Name: web.SessionCookieName, Value: cookie.Value})
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestDeletedUserLosesAccess is the attack of issue 10 item 8: on main,
// alice's certificate (12h) and web session (8h) keep working after
// `pctl users rm alice`, on `ssh -J`, on the node port and on connections
// already open. Here the deletion ends her open connections (through the
// proxy and directly on the node) within seconds, refuses new ones with
// the still-valid certificate at the proxy and at the node, and her web
// session answers 401.
func TestDeletedUserLosesAccess(t *testing.T) {
	c := newAllInOne(t)
	proxyAddr := c.p.Addr(service.ListenerProxySSH).String()
	nodeAddr := c.p.Addr(service.ListenerNode).String()
	webAddr := c.p.Addr(service.ListenerWeb).String()
	target := net.JoinHostPort(c.hostname, "0")
	hc := c.webClient(t)

	cookie, token := webLogin(t, hc, webAddr, "alice", "correct horse battery")
	code, body := webNodes(t, hc, webAddr, cookie, token)
	require.Equal(t, http.StatusOK, code, body)

	// A long-lived connection through the proxy (what ssh -J under a
	// ControlMaster holds) and one straight to the node's port.
	proxyClt, _, err := bannerDial(t, nil, proxyAddr, c.clientConfig(t))
	require.NoError(t, err)
	viaProxy, _, err := bannerDial(t, proxyClt, target, c.clientConfig(t))
	require.NoError(t, err)
	jumped := startOpenSession(t, viaProxy)
	direct, _, err := bannerDial(t, nil, nodeAddr, c.clientConfig(t))
	require.NoError(t, err)
	onNode := startOpenSession(t, direct)
	proxyEnded := make(chan struct{})
	go func() {
		_ = proxyClt.Wait()
		close(proxyEnded)
	}()

	// A real OpenSSH ControlMaster through the proxy (ssh -J), with a
	// command multiplexed over it to show it is live.
	requireOpenSSH(t, "ssh")
	sshCfg := c.opensshConfig(t, "")
	ctlPath := filepath.Join(t.TempDir(), "cm")
	master := exec.Command("ssh", "-F", sshCfg, "-M", "-S", ctlPath, "-N", c.hostname)
	masterErr := &syncBuffer{}
	master.Stderr = masterErr
	require.NoError(t, master.Start())
	t.Cleanup(func() { _ = master.Process.Kill() })
	masterExited := make(chan struct{})
	go func() {
		_ = master.Wait()
		close(masterExited)
	}()
	require.Eventually(t, func() bool {
		out, err := exec.Command("ssh", "-F", sshCfg, "-S", ctlPath, "-o", "ControlMaster=no", c.hostname, "echo muxed").CombinedOutput()
		return err == nil && string(out) == "muxed\n"
	}, lockWait, 50*time.Millisecond, "the ControlMaster never came up: %s", masterErr)

	mustPctl(t, c.dataDir, "", "users", "rm", "alice")

	const want = "postern: access for user alice is locked: the user was deleted"
	require.Contains(t, jumped.requireEnded(t, "through the proxy"), want)
	require.Contains(t, onNode.requireEnded(t, "on the node port"), want)
	select {
	case <-proxyEnded:
	case <-time.After(lockWait):
		t.Fatal("the proxy kept the deleted user's connection open")
	}
	select {
	case <-masterExited:
	case <-time.After(lockWait):
		t.Fatal("the deleted user's OpenSSH ControlMaster stayed connected")
	}

	// The web session is refused at once (bounded: the deletion's lock
	// reaches the web server through a watch).
	require.Eventually(t, func() bool {
		code, _ := webNodes(t, hc, webAddr, cookie, token)
		return code == http.StatusUnauthorized
	}, lockWait, 20*time.Millisecond)

	// The certificate is still within its validity, and refused everywhere.
	_, banner, err := bannerDial(t, nil, proxyAddr, c.clientConfig(t))
	require.Error(t, err, "the proxy accepted a deleted user")
	require.Contains(t, banner, want)
	_, banner, err = bannerDial(t, nil, nodeAddr, c.clientConfig(t))
	require.Error(t, err, "the node accepted a deleted user")
	require.Contains(t, banner, want)

	// And logging in again gets nothing.
	resp, err := hc.Post("https://"+webAddr+"/webapi/sessions", "application/json",
		strings.NewReader(`{"user":"alice","password":"correct horse battery","otp_token":""}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	out := mustPctl(t, c.dataDir, "", "locks", "ls")
	require.Contains(t, out, `user "alice"`)
	require.Contains(t, out, "the user was deleted")

	// Re-creating the name does not revive the old certificate: the new
	// account stays locked until the admin lifts the lock, and is told so.
	out = mustPctl(t, c.dataDir, "another password\n", "users", "add", "alice", "--logins", c.login)
	require.Contains(t, out, `Note: user "alice" is locked (the user was deleted)`)
	_, _, err = bannerDial(t, nil, nodeAddr, c.clientConfig(t))
	require.Error(t, err)
}

// TestLockUserAndNode: `pctl lock --user` ends the user's open connection
// with the message and refuses new ones until `pctl unlock`; `pctl lock
// --node` makes the proxy refuse to route to the node and the node refuse
// connections, until unlocked.
func TestLockUserAndNode(t *testing.T) {
	c := newAllInOne(t)
	proxyAddr := c.p.Addr(service.ListenerProxySSH).String()
	nodeAddr := c.p.Addr(service.ListenerNode).String()
	target := net.JoinHostPort(c.hostname, "0")
	clt := adminClient(t, c.dataDir, c.p)
	mustPctl(t, c.dataDir, "password-bob\n", "users", "add", "bob", "--logins", c.login)
	bob := issueCert(t, clt, "bob", 10*time.Minute)
	bobConfig := func() *ssh.ClientConfig {
		cfg := c.clientConfig(t)
		cfg.Auth = []ssh.AuthMethod{ssh.PublicKeys(bob.signer(t, nil))}
		return cfg
	}

	proxyClt, _, err := bannerDial(t, nil, proxyAddr, bobConfig())
	require.NoError(t, err)
	viaProxy, _, err := bannerDial(t, proxyClt, target, bobConfig())
	require.NoError(t, err)
	open := startOpenSession(t, viaProxy)

	out := mustPctl(t, c.dataDir, "", "lock", "--user", "bob", "--ttl", "1m", "--message", "incident 42")
	require.Contains(t, out, `Locked user "bob" until `)
	require.Contains(t, out, "Message: incident 42")
	const want = "postern: access for user bob is locked: incident 42"
	require.Contains(t, open.requireEnded(t, "bob's open connection"), want)

	_, banner, err := bannerDial(t, nil, proxyAddr, bobConfig())
	require.Error(t, err)
	require.Contains(t, banner, want)
	_, banner, err = bannerDial(t, nil, nodeAddr, bobConfig())
	require.Error(t, err)
	require.Contains(t, banner, want)
	// alice is not concerned.
	_, err = c.viaJump(t, target)
	require.NoError(t, err)

	out = mustPctl(t, c.dataDir, "", "locks", "ls")
	require.Contains(t, out, `user "bob"`)
	require.Contains(t, out, "incident 42")
	require.Contains(t, out, "admin")

	out = mustPctl(t, c.dataDir, "", "get", "lock", "bob")
	require.Contains(t, out, "user: bob")
	require.Contains(t, out, "message: incident 42")
	require.Contains(t, out, "expires:")

	out = mustPctl(t, c.dataDir, "", "unlock", "--user", "bob")
	require.Equal(t, "Unlocked user \"bob\".\n", out)
	require.Eventually(t, func() bool {
		p, _, err := bannerDial(t, nil, proxyAddr, bobConfig())
		if err != nil {
			return false
		}
		defer p.Close()
		n, _, err := bannerDial(t, p, target, bobConfig())
		if err != nil {
			return false
		}
		n.Close()
		return true
	}, lockWait, 20*time.Millisecond, "unlock did not restore bob's access")

	// A node lock, by hostname: the proxy refuses to route there (the user
	// may reach the node, so is told why) and the node refuses.
	uuid := c.p.HostUUID()
	aliceProxy, _, err := bannerDial(t, nil, proxyAddr, c.clientConfig(t))
	require.NoError(t, err)
	aliceOnNode, _, err := bannerDial(t, aliceProxy, target, c.clientConfig(t))
	require.NoError(t, err)
	aliceOpen := startOpenSession(t, aliceOnNode)
	out = mustPctl(t, c.dataDir, "", "lock", "--node", c.hostname, "--message", "maintenance")
	require.Contains(t, out, fmt.Sprintf("Locked node %q (%s) until `pctl unlock`.", c.hostname, uuid))
	wantNode := fmt.Sprintf("postern: node %s is locked: maintenance", uuid)
	require.Contains(t, aliceOpen.requireEnded(t, "the open session on the locked node"), wantNode)
	require.Eventually(t, func() bool {
		p, _, err := bannerDial(t, nil, proxyAddr, c.clientConfig(t))
		if err != nil {
			return false
		}
		defer p.Close()
		_, err = p.Dial("tcp", target)
		return err != nil && strings.Contains(err.Error(), wantNode)
	}, lockWait, 20*time.Millisecond, "the proxy still routes to the locked node")
	_, banner, err = bannerDial(t, nil, nodeAddr, c.clientConfig(t))
	require.Error(t, err)
	require.Contains(t, banner, wantNode)

	_, errOut, err := pctl(t, c.dataDir, "", "lock", "--user", "bob", "--node", c.hostname)
	require.Error(t, err)
	require.Contains(t, errOut, "exactly one of --user or --node")
	_, errOut, err = pctl(t, c.dataDir, "", "lock", "--node", "no-such-node")
	require.Error(t, err)
	require.Contains(t, errOut, `no node has the UUID or hostname "no-such-node"`)

	mustPctl(t, c.dataDir, "", "unlock", "--node", uuid)
	require.Eventually(t, func() bool {
		p, _, err := bannerDial(t, nil, proxyAddr, c.clientConfig(t))
		if err != nil {
			return false
		}
		defer p.Close()
		n, _, err := bannerDial(t, p, target, c.clientConfig(t))
		if err != nil {
			return false
		}
		n.Close()
		return true
	}, lockWait, 20*time.Millisecond, "unlock did not restore routing to the node")
	require.Equal(t, "No locks.\n", mustPctl(t, c.dataDir, "", "locks", "ls"))
}

// TestLockReachesJoinedNode: a node in its own process, joined with a
// token, learns locks through the auth API's watch: it ends a locked
// user's open OpenSSH session (ssh -J, the reason printed) and refuses new
// connections on its own port, and it refuses everyone once it is locked
// itself.
func TestLockReachesJoinedNode(t *testing.T) {
	requireOpenSSH(t, "ssh")
	c := newAllInOne(t)
	out := mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, "join command in %q", out)
	cfg2 := procConfig(t.TempDir(), config.RoleNode)
	cfg2.AuthServer, cfg2.Token, cfg2.CAPin, cfg2.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], "second"
	cfg2.Labels = map[string]string{"env": "it"}
	second := startProcess(t, cfg2)
	waitNodes(t, adminClient(t, c.dataDir, c.p), 2)
	secondAddr := second.Addr(service.ListenerNode).String()
	secondPort := portOf(t, second.Addr(service.ListenerNode))

	// OpenSSH prints banners and the session's stderr at LogLevel INFO.
	sshCfg := c.opensshConfig(t, fmt.Sprintf("Host second\n  Port %d\n  ProxyJump proxy\n", secondPort))
	data, err := os.ReadFile(sshCfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(sshCfg, bytes.ReplaceAll(data, []byte("LogLevel ERROR"), []byte("LogLevel INFO")), 0o600))

	cmd := exec.Command("ssh", "-F", sshCfg, "second", "echo ready; exec sleep 600")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	line := make([]byte, len("ready\n"))
	_, err = io.ReadFull(stdout, line)
	require.NoError(t, err, "ssh -J never got a shell: %s", stderr.String())
	exited := make(chan error, 1)
	go func() {
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()

	mustPctl(t, c.dataDir, "", "lock", "--user", "alice", "--message", "incident 42")
	const want = "postern: access for user alice is locked: incident 42"
	select {
	case err := <-exited:
		require.Error(t, err)
	case <-time.After(lockWait):
		t.Fatal("the locked user's ssh -J session on the joined node was not ended")
	}
	require.Contains(t, stderr.String(), want)

	// New attempts: OpenSSH through the proxy prints the refusal; the
	// joined node's own port refuses the still-valid certificate.
	outB, err := exec.Command("ssh", "-F", sshCfg, "second", "true").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(outB), want)
	_, banner, err := bannerDial(t, nil, secondAddr, c.clientConfig(t))
	require.Error(t, err)
	require.Contains(t, banner, want)

	mustPctl(t, c.dataDir, "", "unlock", "--user", "alice")
	require.Eventually(t, func() bool {
		n, _, err := bannerDial(t, nil, secondAddr, c.clientConfig(t))
		if err != nil {
			return false
		}
		n.Close()
		return true
	}, lockWait, 20*time.Millisecond, "unlock never reached the joined node")

	mustPctl(t, c.dataDir, "", "lock", "--node", "second", "--message", "maintenance")
	wantNode := fmt.Sprintf("postern: node %s is locked: maintenance", second.HostUUID())
	require.Eventually(t, func() bool {
		_, banner, err := bannerDial(t, nil, secondAddr, c.clientConfig(t))
		return err != nil && strings.Contains(banner, wantNode)
	}, lockWait, 20*time.Millisecond, "the joined node does not refuse connections while locked")
}
