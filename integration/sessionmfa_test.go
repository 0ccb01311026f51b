package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// newSessionMFAEnv is an all-in-one cluster with a role that requires a
// fresh factor per session on every node, and user dora (password "dora
// password 1") holding it, with a TOTP; code(step) is dora's code for
// the time step step steps from now.
func newSessionMFAEnv(t *testing.T) (*allInOne, func(step int) string) {
	t.Helper()
	return sessionMFAOn(t, newAllInOne(t))
}

// sessionMFAOn is newSessionMFAEnv on cluster c.
func sessionMFAOn(t *testing.T, c *allInOne) (*allInOne, func(step int) string) {
	t.Helper()
	role := filepath.Join(t.TempDir(), "role.yaml")
	require.NoError(t, os.WriteFile(role, []byte(fmt.Sprintf(`kind: role
version: v1
metadata: {name: sensitive}
spec:
  logins: [%q]
  node_labels: {"*": "*"}
  require_session_mfa: true
`, c.login)), 0o600))
	mustPctl(t, c.dataDir, "", "create", "-f", role)
	out := mustPctl(t, c.dataDir, "dora password 1\n", "users", "add", "dora", "--logins", c.login, "--roles", "sensitive", "--otp")
	m := regexp.MustCompile(`secret=([A-Z2-7]+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	secret := m[1]
	return c, func(step int) string {
		s, err := totp.GenerateCode(secret, time.Now().Add(time.Duration(step)*30*time.Second))
		require.NoError(t, err)
		return s
	}
}

// TestSessionMFAThroughPsh: a role with require_session_mfa, through the
// built binaries. psh ssh asks for a fresh OTP code for each session and
// connects with a per-session certificate; without the code it is
// refused, and so is an `ssh -J`-style hop with the login's certificate
// (told to use psh ssh).
func TestSessionMFAThroughPsh(t *testing.T) {
	c, code := newSessionMFAEnv(t)
	e := newPshEnv(t, c)
	e.login(t, "dora", "dora password 1\n"+code(0)+"\n")

	// No code: refused, saying why.
	_, errOut, rc := e.run(t, "", "ssh", c.hostname, "echo", "hi")
	require.NotEqual(t, 0, rc)
	require.Contains(t, errOut, "fresh second factor", errOut)

	// A fresh code (another time step than the login's): the session runs.
	require.Equal(t, "hi\n", e.mustRun(t, code(1)+"\n", "ssh", c.hostname, "echo", "hi"))
	// The same code again is spent.
	_, errOut, rc = e.run(t, code(1)+"\n", "ssh", c.hostname, "echo", "hi")
	require.NotEqual(t, 0, rc)
	require.Contains(t, errOut, "no per-session certificate", errOut)

	// ssh -J with the login's certificate: refused at the proxy, told to
	// use psh ssh.
	keyPath := filepath.Join(e.home, "keys", e.webAddr(), "dora")
	keyPEM, err := os.ReadFile(keyPath)
	require.NoError(t, err)
	signer, err := ssh.ParsePrivateKey(keyPEM)
	require.NoError(t, err)
	certData, err := os.ReadFile(keyPath + "-cert.pub")
	require.NoError(t, err)
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certData)
	require.NoError(t, err)
	certSigner, err := ssh.NewCertSigner(pub.(*ssh.Certificate), signer)
	require.NoError(t, err)
	cfg := &ssh.ClientConfig{User: c.login, Auth: []ssh.AuthMethod{ssh.PublicKeys(certSigner)}, HostKeyCallback: ssh.InsecureIgnoreHostKey()} //nolint:gosec // the proxy's identity is not what this test is about
	pc, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
	require.NoError(t, err)
	defer pc.Close()
	nodePort := strconv.Itoa(c.p.Addr(service.ListenerNode).(*net.TCPAddr).Port)
	_, err = pc.Dial("tcp", net.JoinHostPort(c.hostname, nodePort))
	require.Error(t, err)
	require.Contains(t, err.Error(), proxyapi.MsgSessionMFARequired)

	// Straight to the node's port with the login's certificate: the node
	// holds the requirement too.
	_, err = ssh.Dial("tcp", c.p.Addr(service.ListenerNode).String(), cfg)
	require.Error(t, err, "the node refuses a normal certificate where a role requires a fresh factor per session")

	// A user whose roles do not require it is not asked (alice).
	e2 := newPshEnv(t, c)
	e2.login(t, "alice", alicePassword+"\n")
	require.Equal(t, "ok\n", e2.mustRun(t, "", "ssh", c.hostname, "echo", "ok"))
}

// pshCertSigner is the key and certificate psh login stored for user.
func pshCertSigner(t *testing.T, e *pshEnv, user string) (ssh.Signer, ssh.Signer) {
	t.Helper()
	keyPath := filepath.Join(e.home, "keys", e.webAddr(), user)
	keyPEM, err := os.ReadFile(keyPath)
	require.NoError(t, err)
	key, err := ssh.ParsePrivateKey(keyPEM)
	require.NoError(t, err)
	certData, err := os.ReadFile(keyPath + "-cert.pub")
	require.NoError(t, err)
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certData)
	require.NoError(t, err)
	signer, err := ssh.NewCertSigner(pub.(*ssh.Certificate), key)
	require.NoError(t, err)
	return key, signer
}

// TestSessionMFACertAttacks: a per-session certificate, taken through the
// real proxy's session-mfa-cert subsystem with a raw SSH client, reaches
// the node it was issued for and no other; replayed after its minute it
// is refused at the proxy's door.
func TestSessionMFACertAttacks(t *testing.T) {
	c, code := newSessionMFAEnv(t)
	out := mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, "join command in %q", out)
	cfg := procConfig(t.TempDir(), config.RoleNode)
	cfg.ClusterName = ""
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], "node-2"
	startProcess(t, cfg)
	waitNodes(t, adminClient(t, c.dataDir, c.p), 2)

	e := newPshEnv(t, c)
	e.login(t, "dora", "dora password 1\n"+code(0)+"\n")
	key, loginSigner := pshCertSigner(t, e, "dora")
	proxyAddr := c.p.Addr(service.ListenerProxySSH).String()
	dial := func(signer ssh.Signer) (*ssh.Client, error) {
		return ssh.Dial("tcp", proxyAddr, &ssh.ClientConfig{User: c.login, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second}) //nolint:gosec // the proxy's identity is not under test
	}

	// The per-session certificate for node-1, as psh gets it.
	pc, err := dial(loginSigner)
	require.NoError(t, err)
	ch, reqs, err := pc.OpenChannel("session", nil)
	require.NoError(t, err)
	go ssh.DiscardRequests(reqs)
	ok, err := ch.SendRequest("subsystem", true, ssh.Marshal(struct{ Name string }{proxyapi.SubsystemSessionMFACert}))
	require.NoError(t, err)
	require.True(t, ok)
	req, err := json.Marshal(proxyapi.SessionMFACertRequest{Target: c.hostname, Login: c.login, OTP: code(1), PublicKey: string(ssh.MarshalAuthorizedKey(key.PublicKey()))})
	require.NoError(t, err)
	_, err = ch.Write(req)
	require.NoError(t, err)
	require.NoError(t, ch.CloseWrite())
	answer, err := io.ReadAll(ch)
	require.NoError(t, err)
	stderr, _ := io.ReadAll(ch.Stderr())
	ch.Close()
	pc.Close()
	issued := time.Now()
	var resp proxyapi.SessionMFACertResponse
	require.NoError(t, json.Unmarshal(answer, &resp), string(stderr))
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(resp.Cert))
	require.NoError(t, err)
	sessionSigner, err := ssh.NewCertSigner(pub.(*ssh.Certificate), key)
	require.NoError(t, err)

	nodePort := strconv.Itoa(c.p.Addr(service.ListenerNode).(*net.TCPAddr).Port)
	pc, err = dial(sessionSigner)
	require.NoError(t, err)
	defer pc.Close()
	// Reused for another node: refused by the proxy.
	_, err = pc.Dial("tcp", net.JoinHostPort("node-2", "0"))
	require.Error(t, err)
	require.Contains(t, err.Error(), "issued for another node")
	// Its own node: a session runs.
	conn, err := pc.Dial("tcp", net.JoinHostPort(c.hostname, nodePort))
	require.NoError(t, err)
	nc, chans, reqs, err := ssh.NewClientConn(conn, c.hostname, &ssh.ClientConfig{User: c.login, Auth: []ssh.AuthMethod{ssh.PublicKeys(sessionSigner)}, HostKeyCallback: ssh.InsecureIgnoreHostKey()}) //nolint:gosec // as above
	require.NoError(t, err)
	node := ssh.NewClient(nc, chans, reqs)
	got, err := run(t, node, "echo per-session")
	require.NoError(t, err)
	require.Equal(t, "per-session\n", got)
	node.Close()

	// Replayed after its minute: the proxy refuses the certificate itself.
	// Polled: it must work until the minute is over, and not after.
	var refusedAt time.Time
	require.Eventually(t, func() bool {
		clt, err := dial(sessionSigner)
		if err != nil {
			refusedAt = time.Now()
			return true
		}
		clt.Close()
		return false
	}, 2*time.Minute, 2*time.Second)
	require.GreaterOrEqual(t, refusedAt.Sub(issued), 50*time.Second, "refused too early: the certificate should last its minute")
}
