package integration

import (
	"fmt"
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
	"github.com/postern-dev/postern/lib/service"
)

// TestSessionMFAThroughPsh: a role with require_session_mfa, through the
// built binaries. psh ssh asks for a fresh OTP code for each session and
// connects with a per-session certificate; without the code it is
// refused, and so is an `ssh -J`-style hop with the login's certificate
// (told to use psh ssh).
func TestSessionMFAThroughPsh(t *testing.T) {
	c := newAllInOne(t)
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
	code := func(step int) string {
		s, err := totp.GenerateCode(secret, time.Now().Add(time.Duration(step)*30*time.Second))
		require.NoError(t, err)
		return s
	}

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

	// A user whose roles do not require it is not asked (alice).
	e2 := newPshEnv(t, c)
	e2.login(t, "alice", alicePassword+"\n")
	require.Equal(t, "ok\n", e2.mustRun(t, "", "ssh", c.hostname, "echo", "ok"))
}
