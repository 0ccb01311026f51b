package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// allInOne is a running auth+proxy+node cluster with one user whose
// logins include the OS user running the tests.
type allInOne struct {
	p        *service.Process
	dataDir  string
	login    string
	hostname string
	// keyPath, keyPath-cert.pub and keyPath.known_hosts from `pctl auth sign`.
	keyPath string
}

func newAllInOne(t testing.TB) *allInOne {
	t.Helper()
	dir := t.TempDir()
	cfg := procConfig(dir, config.RoleAuth, config.RoleProxy, config.RoleNode)
	cfg.NodeName = "node-1"
	cfg.Labels = map[string]string{"env": "it"}
	p := startProcess(t, cfg)
	u, err := user.Current()
	require.NoError(t, err)
	mustPctl(t, dir, "correct horse battery\n", "users", "add", "alice", "--logins", u.Username)
	keyPath := filepath.Join(t.TempDir(), "alice")
	mustPctl(t, dir, "", "auth", "sign", "--user", "alice", "--ttl", "10m", "--out", keyPath)
	clt := adminClient(t, dir, p)
	waitNodes(t, clt, 1)
	return &allInOne{p: p, dataDir: dir, login: u.Username, hostname: "node-1", keyPath: keyPath}
}

// clientConfig is an x/crypto client config from the `pctl auth sign`
// files: certificate auth, host keys checked against the host CA.
func (c *allInOne) clientConfig(t testing.TB) *ssh.ClientConfig {
	t.Helper()
	keyPEM, err := os.ReadFile(c.keyPath)
	require.NoError(t, err)
	signer, err := ssh.ParsePrivateKey(keyPEM)
	require.NoError(t, err)
	certBytes, err := os.ReadFile(c.keyPath + "-cert.pub")
	require.NoError(t, err)
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	require.NoError(t, err)
	certSigner, err := ssh.NewCertSigner(pub.(*ssh.Certificate), signer)
	require.NoError(t, err)
	return &ssh.ClientConfig{
		User:            c.login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(certSigner)},
		HostKeyCallback: hostCAChecker(t, c.keyPath+".known_hosts"),
	}
}

// viaJump dials the node through the proxy's direct-tcpip, as ssh -J does.
func (c *allInOne) viaJump(t *testing.T, target string) (*ssh.Client, error) {
	t.Helper()
	cfg := c.clientConfig(t)
	proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	conn, err := proxy.Dial("tcp", target)
	if err != nil {
		return nil, err
	}
	sconn, chans, reqs, err := ssh.NewClientConn(conn, target, cfg)
	if err != nil {
		return nil, err
	}
	clt := ssh.NewClient(sconn, chans, reqs)
	t.Cleanup(func() { clt.Close() })
	return clt, nil
}

// hostCAChecker verifies host certificates against the @cert-authority
// lines of a known_hosts file. (x/crypto's knownhosts package matches the
// "*" pattern on port 22 only, unlike OpenSSH, so it cannot be used for
// nodes on other ports.)
func hostCAChecker(t testing.TB, path string) ssh.HostKeyCallback {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var cas []ssh.PublicKey
	for len(data) > 0 {
		marker, _, key, _, rest, err := ssh.ParseKnownHosts(data)
		if err != nil {
			break
		}
		if marker == "cert-authority" {
			cas = append(cas, key)
		}
		data = rest
	}
	require.NotEmpty(t, cas)
	return authz.HostKeyCallback(cas, nil)
}

func run(t *testing.T, clt *ssh.Client, cmd string) (string, error) {
	t.Helper()
	s, err := clt.NewSession()
	require.NoError(t, err)
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	return string(out), err
}

func TestJumpThroughProxy(t *testing.T) {
	c := newAllInOne(t)
	nodePort := strconv.Itoa(c.p.Addr(service.ListenerNode).(*net.TCPAddr).Port)

	for _, target := range []string{
		net.JoinHostPort(c.hostname, nodePort),            // hostname and its port
		net.JoinHostPort(c.hostname, "22"),                // OpenSSH's default port means any
		net.JoinHostPort(c.hostname+"."+clusterName, "0"), // NAME.CLUSTER
		net.JoinHostPort(c.p.HostUUID(), "0"),             // uuid
		c.p.Addr(service.ListenerNode).String(),           // registered address
	} {
		t.Run(target, func(t *testing.T) {
			clt, err := c.viaJump(t, target)
			require.NoError(t, err)
			out, err := run(t, clt, "echo hello; echo $SSH_POSTERN_USER $SSH_POSTERN_CLUSTER_NAME")
			require.NoError(t, err)
			require.Equal(t, "hello\nalice "+clusterName+"\n", out)
		})
	}

	t.Run("not found", func(t *testing.T) {
		_, err := c.viaJump(t, "nope:22")
		// x/crypto quotes the rejection message with %q.
		require.ErrorContains(t, err, `node \"nope\" not found in cluster \"it\"`)
	})
	t.Run("unregistered address is never dialed", func(t *testing.T) {
		// A listener nobody registered: the proxy must refuse without
		// connecting to it.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		// The kernel queues every connection made to ln in the order it
		// was made, accepted or not: the accept loop reports them in
		// that order.
		accepted := make(chan string, 16)
		go func() {
			defer close(accepted)
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				accepted <- conn.RemoteAddr().String()
				conn.Close()
			}
		}()
		defer func() {
			ln.Close()
			for range accepted {
			}
		}()
		_, err = c.viaJump(t, ln.Addr().String())
		require.ErrorContains(t, err, "not found")
		// A probe made after the refusal came back is queued behind any
		// connection the proxy made before refusing: it must be the
		// first one accepted.
		probe, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer probe.Close()
		require.Equal(t, probe.LocalAddr().String(), <-accepted, "the proxy dialed an unregistered address")
	})
	t.Run("exit status", func(t *testing.T) {
		clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
		require.NoError(t, err)
		_, err = run(t, clt, "exit 7")
		var exitErr *ssh.ExitError
		require.ErrorAs(t, err, &exitErr)
		require.Equal(t, 7, exitErr.ExitStatus())
	})
}

func TestProxyRefusesShell(t *testing.T) {
	c := newAllInOne(t)
	proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), c.clientConfig(t))
	require.NoError(t, err)
	defer proxy.Close()
	s, err := proxy.NewSession()
	require.NoError(t, err)
	defer s.Close()
	var stderr bytes.Buffer
	s.Stderr = &stderr
	err = s.Run("id")
	require.Error(t, err)
	require.Contains(t, stderr.String(), "ssh -J")
}

// opensshConfig writes an ssh_config that reaches the node through the
// proxy with the `pctl auth sign` files; -F is passed on to the jump hop.
func (c *allInOne) opensshConfig(t *testing.T, extra string) string {
	t.Helper()
	proxyAddr := c.p.Addr(service.ListenerProxySSH).(*net.TCPAddr)
	nodePort := c.p.Addr(service.ListenerNode).(*net.TCPAddr).Port
	cfg := fmt.Sprintf(`Host proxy
  HostName 127.0.0.1
  Port %d
Host %s
  Port %d
  ProxyJump proxy
Host *
  User %s
  IdentityFile %s
  CertificateFile %s-cert.pub
  IdentitiesOnly yes
  UserKnownHostsFile %s.known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
%s`, proxyAddr.Port, c.hostname, nodePort, c.login, c.keyPath, c.keyPath, c.keyPath, extra)
	path := filepath.Join(t.TempDir(), "ssh_config")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}

func requireOpenSSH(t *testing.T, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; .ci/run must install openssh-client", b)
			}
			t.Skipf("%s is not installed (apt-get install openssh-client); CI installs it", b)
		}
	}
}

func TestOpenSSHThroughProxy(t *testing.T) {
	requireOpenSSH(t, "ssh", "scp", "sftp")
	c := newAllInOne(t)
	cfg := c.opensshConfig(t, "")

	t.Run("ssh -J", func(t *testing.T) {
		out, err := exec.Command("ssh", "-F", cfg, c.hostname, "echo jumped").CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "jumped\n", string(out))
	})
	t.Run("ProxyCommand with the proxy subsystem", func(t *testing.T) {
		pc := fmt.Sprintf("ProxyCommand ssh -F %s proxy -s proxy:%%h:%%p@%s", cfg, clusterName)
		out, err := exec.Command("ssh", "-F", cfg, "-o", "ProxyJump=none", "-o", pc, c.hostname, "echo subsystem").CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "subsystem\n", string(out))
	})
	t.Run("half-close", func(t *testing.T) {
		cmd := exec.Command("ssh", "-F", cfg, c.hostname, "cat; echo done")
		cmd.Stdin = strings.NewReader("abc")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, "abcdone\n", string(out))
	})
	t.Run("scp and sftp via -J", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "src.bin")
		data := bytes.Repeat([]byte("postern-"), 512*1024) // 4 MiB
		require.NoError(t, os.WriteFile(src, data, 0o600))
		remote := filepath.Join(dir, "remote.bin")
		out, err := exec.Command("scp", "-F", cfg, src, c.hostname+":"+remote).CombinedOutput()
		require.NoError(t, err, string(out))
		got, err := os.ReadFile(remote)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got), "scp copy differs")

		back := filepath.Join(dir, "back.bin")
		batch := filepath.Join(dir, "batch")
		require.NoError(t, os.WriteFile(batch, []byte("get "+remote+" "+back+"\n"), 0o600))
		out, err = exec.Command("sftp", "-F", cfg, "-b", batch, c.hostname).CombinedOutput()
		require.NoError(t, err, string(out))
		got, err = os.ReadFile(back)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got), "sftp copy differs")
	})
	t.Run("proxy refuses an unknown subsystem string", func(t *testing.T) {
		out, err := exec.Command("ssh", "-F", cfg, "proxy", "-s", "proxy:").CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), `invalid proxy subsystem request "proxy:"`)
	})
	t.Run("agent forwarding through the jump", func(t *testing.T) {
		requireOpenSSH(t, "ssh-agent", "ssh-add")
		sock := filepath.Join(t.TempDir(), "agent.sock")
		agent := exec.Command("ssh-agent", "-D", "-a", sock)
		require.NoError(t, agent.Start())
		t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
		env := append(os.Environ(), "SSH_AUTH_SOCK="+sock)
		require.Eventually(t, func() bool { _, err := os.Stat(sock); return err == nil }, 10e9, 20e6)
		add := exec.Command("ssh-add", c.keyPath)
		add.Env = env
		out, err := add.CombinedOutput()
		require.NoError(t, err, string(out))
		cmd := exec.Command("ssh", "-F", cfg, "-A", c.hostname, "ssh-add -l; ssh-add -l")
		cmd.Env = env
		out, err = cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		// ssh-add loaded the key and its certificate; both listings on the
		// node must show the certificate, each through its own channel.
		require.Equal(t, 2, strings.Count(string(out), "(ED25519-CERT)"), string(out))
	})
}
