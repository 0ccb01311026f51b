package srv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// opensshEnv drives the real OpenSSH client against a test node.
type opensshEnv struct {
	*testEnv
	dir  string
	args []string // common ssh options
	port string
}

func lookPaths(t *testing.T, bins ...string) {
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			if os.Getenv("CI") != "" {
				// CI installs OpenSSH (.ci/run): never skip there silently.
				t.Fatalf("OpenSSH binary %q not installed in CI: %v", b, err)
			}
			t.Skipf("OpenSSH binary %q not installed (apt-get install openssh-client): %v", b, err)
		}
	}
}

func newOpenSSHEnv(t *testing.T) *opensshEnv {
	lookPaths(t, "ssh")
	e := newTestEnv(t)
	dir := t.TempDir()
	// A fresh ed25519 key written in OpenSSH format with its certificate.
	priv, signer := newEd25519PEM(t)
	cert := e.userCA.SignUser(t, signer.PublicKey(), srvtest.UserCert{User: "alice", Logins: []string{e.me}, Cluster: testCluster})
	keyPath := filepath.Join(dir, "id")
	require.NoError(t, os.WriteFile(keyPath, priv, 0o600))
	require.NoError(t, os.WriteFile(keyPath+"-cert.pub", ssh.MarshalAuthorizedKey(cert), 0o600))
	kh := filepath.Join(dir, "known_hosts")
	require.NoError(t, os.WriteFile(kh, []byte("@cert-authority * "+e.hostCA.AuthorizedKey()+"\n"), 0o600))
	_, port, _ := net.SplitHostPort(e.addr)
	o := &opensshEnv{testEnv: e, dir: dir, port: port}
	o.args = []string{
		"-F", "/dev/null",
		"-o", "UserKnownHostsFile=" + kh,
		"-o", "StrictHostKeyChecking=yes",
		"-o", "IdentitiesOnly=yes",
		"-o", "IdentityFile=" + keyPath,
		"-o", "CertificateFile=" + keyPath + "-cert.pub",
		"-o", "BatchMode=yes",
		"-o", "LogLevel=ERROR",
		"-o", "User=" + e.me,
	}
	return o
}

func newEd25519PEM(t *testing.T) ([]byte, ssh.Signer) {
	_, priv, err := ed25519GenerateKey()
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "")
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return pem.EncodeToMemory(block), signer
}

// ssh runs the OpenSSH client with a deadline: a client that hangs on exit
// fails the test instead of the suite.
func (o *opensshEnv) ssh(t *testing.T, stdin string, extra ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append(append([]string{}, o.args...), "-p", o.port)
	args = append(args, extra...)
	cmd := exec.CommandContext(ctx, "ssh", args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		for _, en := range o.logs.AllEntries() {
			l, _ := en.String()
			t.Log(l)
		}
	}
	require.NoError(t, ctx.Err(), "ssh did not exit: stderr %q", errb.String())
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return out.String(), errb.String(), code
}

func TestOpenSSHExecAndHalfClose(t *testing.T) {
	o := newOpenSSHEnv(t)
	out, errOut, code := o.ssh(t, "", "127.0.0.1", "echo hello; echo oops >&2; exit 5")
	require.Equal(t, 5, code)
	require.Equal(t, "hello\n", out)
	require.Equal(t, "oops\n", errOut)

	out, _, code = o.ssh(t, "abc", "127.0.0.1", "cat; echo done")
	require.Equal(t, 0, code)
	require.Equal(t, "abcdone\n", out)

	// env: SendEnv of an allowed and a refused variable.
	t.Setenv("LC_POSTERN_TEST", "yes")
	t.Setenv("POSTERN_REFUSED", "no")
	out, _, code = o.ssh(t, "", "-o", "SendEnv=LC_POSTERN_TEST POSTERN_REFUSED", "127.0.0.1",
		`echo "$LC_POSTERN_TEST-${POSTERN_REFUSED:-unset}"`)
	require.Equal(t, 0, code)
	require.Equal(t, "yes-unset\n", out)
}

func TestOpenSSHPTY(t *testing.T) {
	o := newOpenSSHEnv(t)
	out, _, code := o.ssh(t, "", "-tt", "127.0.0.1", "tty")
	require.Equal(t, 0, code)
	require.Regexp(t, regexp.MustCompile(`^/dev/pts/\d+\r\n$`), out)
}

func TestOpenSSHSFTPAndSCP(t *testing.T) {
	o := newOpenSSHEnv(t)
	lookPaths(t, "sftp", "scp")
	data := make([]byte, 4<<20+7)
	_, _ = rand.Read(data)
	src := filepath.Join(o.dir, "src.bin")
	require.NoError(t, os.WriteFile(src, data, 0o600))
	remote := t.TempDir()

	batch := filepath.Join(o.dir, "batch")
	require.NoError(t, os.WriteFile(batch, []byte(
		"put "+src+" "+remote+"/up.bin\nget "+remote+"/up.bin "+o.dir+"/down.bin\n"), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append(append([]string{}, o.args...), "-P", o.port, "-b", batch, "127.0.0.1")
	outb, err := exec.CommandContext(ctx, "sftp", args...).CombinedOutput()
	require.NoError(t, err, string(outb))
	for _, p := range []string{remote + "/up.bin", o.dir + "/down.bin"} {
		got, err := os.ReadFile(p)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got), p)
	}

	args = append(append([]string{}, o.args...), "-P", o.port, src, "127.0.0.1:"+remote+"/scp.bin")
	outb, err = exec.CommandContext(ctx, "scp", args...).CombinedOutput()
	require.NoError(t, err, string(outb))
	got, err := os.ReadFile(remote + "/scp.bin")
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
}

func TestOpenSSHForwarding(t *testing.T) {
	o := newOpenSSHEnv(t)
	target := echoServer(t)

	t0 := time.Now()
	// -W is a direct-tcpip channel on stdio, like -L and ProxyJump.
	out, _, code := o.ssh(t, "through -W", "-W", target, "127.0.0.1")
	require.Equal(t, 0, code)
	require.Equal(t, "through -W", out)

	t.Logf("-W took %v", time.Since(t0))
	t0 = time.Now()
	// -R: the remote command connects to the node-side listener.
	lookPaths(t, "bash")
	port := freePort(t)
	out, errOut, code := o.ssh(t, "", "-o", "ExitOnForwardFailure=yes",
		"-R", "127.0.0.1:"+port+":"+target, "127.0.0.1",
		// --norc: Debian's bash sources ~/.bashrc when it sees SSH_CLIENT,
		// and root's here runs a slow pyenv init.
		`bash --norc -c 'exec 3<>/dev/tcp/127.0.0.1/`+port+`; printf remote >&3; head -c 6 <&3'`)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "remote", out)
	t.Logf("-R took %v", time.Since(t0))
}

// freePort is a free loopback port for -L/-R, which need a number.
func freePort(tb testing.TB) string {
	return strconv.Itoa(freeport.Port(tb))
}

// TestOpenSSHAgentForwarding: ssh -A with a real ssh-agent; the agent is
// used twice in a row and twice concurrently, and ssh exits promptly (the
// bug lazy per-use channels exist to avoid).
func TestOpenSSHAgentForwarding(t *testing.T) {
	o := newOpenSSHEnv(t)
	lookPaths(t, "ssh-agent", "ssh-add")
	sock := filepath.Join(o.dir, "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	agentCmd := exec.CommandContext(ctx, "ssh-agent", "-D", "-a", sock)
	require.NoError(t, agentCmd.Start())
	t.Cleanup(func() { cancel(); _ = agentCmd.Wait() })
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	add := exec.Command("ssh-add", filepath.Join(o.dir, "id"))
	add.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	outb, err := add.CombinedOutput()
	require.NoError(t, err, string(outb))
	t.Setenv("SSH_AUTH_SOCK", sock)

	start := time.Now()
	out, errOut, code := o.ssh(t, "", "-A", "127.0.0.1",
		`ssh-add -l; ssh-add -l; ssh-add -l & ssh-add -l & wait; echo end`)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, 4, strings.Count(out, "(ED25519)\n"), out)
	require.True(t, strings.HasSuffix(out, "end\n"), out)
	require.Less(t, time.Since(start), 10*time.Second, "ssh took too long to exit")
}
