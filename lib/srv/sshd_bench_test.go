package srv

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// The same benchmarks against OpenSSH's sshd on loopback, with the same
// x/crypto client, certificate and cipher order: the baseline the node is
// measured against (NOTES.md: always measure both arms in the same run).

const sshdPath = "/usr/sbin/sshd"

// startSSHD runs a throwaway sshd trusting ca for user certificates and
// returns its address and the OS login to use.
func startSSHD(b *testing.B, ca *srvtest.CA) string {
	if _, err := os.Stat(sshdPath); err != nil {
		b.Skipf("OpenSSH server %s not installed (apt-get install openssh-server): %v", sshdPath, err)
	}
	if os.Geteuid() != 0 {
		b.Skip("sshd baseline needs root")
	}
	dir := b.TempDir()
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(b, err)
	block, err := ssh.MarshalPrivateKey(hostPriv, "")
	require.NoError(b, err)
	hostKey := filepath.Join(dir, "host_ed25519")
	require.NoError(b, os.WriteFile(hostKey, pem.EncodeToMemory(block), 0o600))
	caFile := filepath.Join(dir, "user_ca.pub")
	require.NoError(b, os.WriteFile(caFile, []byte(ca.AuthorizedKey()+"\n"), 0o644))
	port := freePort(b)
	conf := filepath.Join(dir, "sshd_config")
	require.NoError(b, os.WriteFile(conf, []byte(`Port `+port+`
ListenAddress 127.0.0.1
HostKey `+hostKey+`
PidFile `+filepath.Join(dir, "sshd.pid")+`
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile none
TrustedUserCAKeys `+caFile+`
StrictModes no
AllowTcpForwarding yes
PrintMotd no
UseDNS no
LogLevel ERROR
`), 0o600))
	require.NoError(b, os.MkdirAll("/run/sshd", 0o755))
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, sshdPath, "-D", "-e", "-f", conf)
	require.NoError(b, cmd.Start())
	b.Cleanup(func() { cancel(); _ = cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", port)
	require.Eventually(b, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	return addr
}

func sshdClientConfig(b *testing.B, ca *srvtest.CA, login string) *ssh.ClientConfig {
	signer := ca.UserSigner(b, srvtest.UserCert{User: "alice", Logins: []string{login}, Cluster: testCluster})
	return aesFirst(&ssh.ClientConfig{
		User:            login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), // loopback benchmark only
		Timeout:         10 * time.Second,
	})
}

func BenchmarkSSHDSessionThroughput(b *testing.B) {
	ca := srvtest.NewCA(b)
	addr := startSSHD(b, ca)
	benchSessionThroughput(b, addr, sshdClientConfig(b, ca, "root"))
}

func BenchmarkSSHDLocalForwardThroughput(b *testing.B) {
	ca := srvtest.NewCA(b)
	addr := startSSHD(b, ca)
	benchForwardThroughput(b, addr, sshdClientConfig(b, ca, "root"))
}
