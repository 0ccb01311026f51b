package srvtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/freeport"
)

// SSHDPath is Debian's OpenSSH server (package openssh-server).
const SSHDPath = "/usr/sbin/sshd"

// SSHDConfig describes an OpenSSH node as an admin sets one up for
// Postern.
type SSHDConfig struct {
	// HostCA signs the server's host certificate (HostCertificate) for
	// HostPrincipals. Nil: no certificate, the server presents its plain
	// key (a stock sshd before it is registered with Postern).
	HostCA         *CA
	HostPrincipals []string
	// UserCAKeys, when set, are trusted for user certificates
	// (TrustedUserCAKeys; authorized_keys lines, as
	// services.CertAuthority holds them) with AuthorizedPrincipalsFile
	// none: a certificate logs in as a login only when it names it among
	// its principals. Empty: no user gets in.
	UserCAKeys []string
	// Extra are more sshd_config lines, after the others (see also
	// SSHD.Reconfigure).
	Extra []string
}

// SSHD is a real sshd on loopback with its own config, host key and host
// certificate, for tests of OpenSSH nodes. Stop and Start it to take the
// node down and bring it back on the same address.
type SSHD struct {
	// Addr is where it listens, 127.0.0.1:PORT.
	Addr string
	// HostCert is the certificate it presents (nil without
	// SSHDConfig.HostCA).
	HostCert *ssh.Certificate
	// HostKey is its public host key (ed25519).
	HostKey ssh.PublicKey

	conf, log string
	// base are the config lines of SSHDConfig without Extra.
	base []string
	cmd  *exec.Cmd
}

// StartSSHD starts an sshd as cfg describes, stopped when the test ends
// (its log printed if the test failed). It skips the test where sshd is
// not installed or the test does not run as root (sshd needs root to
// change to the login's user), and fails it there under CI, which
// installs sshd and runs as root: a real-sshd test never goes silent.
func StartSSHD(t testing.TB, cfg SSHDConfig) *SSHD {
	t.Helper()
	if _, err := os.Stat(SSHDPath); err != nil {
		SkipOrFailInCI(t, "OpenSSH server %s not installed (apt-get install openssh-server): %v", SSHDPath, err)
	}
	if os.Geteuid() != 0 {
		SkipOrFailInCI(t, "sshd must run as root")
	}
	dir := t.TempDir()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "")
	require.NoError(t, err)
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	require.NoError(t, os.WriteFile(hostKey, pem.EncodeToMemory(block), 0o600))
	sshPub, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	port := strconv.Itoa(freeport.Port(t))
	lines := []string{
		"Port " + port,
		"ListenAddress 127.0.0.1",
		"HostKey " + hostKey,
	}
	var cert *ssh.Certificate
	if cfg.HostCA != nil {
		cert = &ssh.Certificate{Key: sshPub, Serial: 1, CertType: ssh.HostCert, KeyId: "openssh-test",
			ValidPrincipals: cfg.HostPrincipals, ValidBefore: ssh.CertTimeInfinity}
		require.NoError(t, cert.SignCert(rand.Reader, cfg.HostCA.Signer))
		hostCert := filepath.Join(dir, "ssh_host_ed25519_key-cert.pub")
		require.NoError(t, os.WriteFile(hostCert, ssh.MarshalAuthorizedKey(cert), 0o644))
		lines = append(lines, "HostCertificate "+hostCert)
	}
	lines = append(lines,
		"PidFile "+filepath.Join(dir, "sshd.pid"),
		// No PAM: with it sshd wants a PAM stack; without it a locked
		// account ('!' in /etc/shadow) is refused, so tests log in as
		// root (allowed with a certificate only).
		"UsePAM no",
		"PermitRootLogin prohibit-password",
		"AuthorizedKeysFile none",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"StrictModes no",
		"UseDNS no",
		"AllowTcpForwarding yes",
		"AllowAgentForwarding yes",
		"LogLevel VERBOSE",
	)
	if len(cfg.UserCAKeys) > 0 {
		caFile := filepath.Join(dir, "postern_user_ca.pub")
		require.NoError(t, os.WriteFile(caFile, []byte(strings.Join(cfg.UserCAKeys, "\n")+"\n"), 0o644))
		lines = append(lines, "TrustedUserCAKeys "+caFile, "AuthorizedPrincipalsFile none")
	}
	s := &SSHD{Addr: net.JoinHostPort("127.0.0.1", port), HostCert: cert, HostKey: sshPub, base: lines,
		conf: filepath.Join(dir, "sshd_config"), log: filepath.Join(dir, "sshd.log")}
	s.Reconfigure(t, cfg.Extra...)
	// Its privilege separation directory, which Debian creates at boot.
	require.NoError(t, os.MkdirAll("/run/sshd", 0o755))
	t.Cleanup(func() {
		s.Stop()
		if b, _ := os.ReadFile(s.log); t.Failed() && len(b) > 0 {
			t.Logf("sshd log:\n%s", b)
		}
	})
	s.Start(t)
	return s
}

// Reconfigure rewrites the config with extra lines in place of the
// previous SSHDConfig.Extra (an Include of an sshd_config snippet, say);
// a running sshd reads it at its next Start.
func (s *SSHD) Reconfigure(t testing.TB, extra ...string) {
	t.Helper()
	lines := append(slices.Clone(s.base), extra...)
	require.NoError(t, os.WriteFile(s.conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
}

// Start runs sshd (again) and waits until it accepts connections.
func (s *SSHD) Start(t testing.TB) {
	t.Helper()
	require.Nil(t, s.cmd, "sshd already running")
	s.cmd = exec.Command(SSHDPath, "-D", "-f", s.conf, "-E", s.log)
	require.NoError(t, s.cmd.Start())
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", s.Addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "sshd did not start listening on %s", s.Addr)
}

// Stop kills sshd and waits for it: the address refuses connections
// until Start.
func (s *SSHD) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// SkipOrFailInCI skips t on a developer's machine that lacks what it
// needs, and fails it under CI (CI set), where it must run.
func SkipOrFailInCI(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}
