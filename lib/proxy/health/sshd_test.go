package health

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

const sshdPath = "/usr/sbin/sshd"

// sshd is Debian's OpenSSH server, run on loopback with its own config,
// host key and a host certificate signed by a test CA: an OpenSSH node
// as an admin sets one up.
type sshd struct {
	addr, conf, log string
	cmd             *exec.Cmd
}

func newSSHD(t *testing.T, ca *srvtest.CA, principals ...string) *sshd {
	t.Helper()
	if _, err := os.Stat(sshdPath); err != nil {
		t.Skipf("OpenSSH server %s not installed (apt-get install openssh-server): %v", sshdPath, err)
	}
	if os.Geteuid() != 0 {
		t.Skip("sshd must run as root")
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
	cert := &ssh.Certificate{Key: sshPub, Serial: 1, CertType: ssh.HostCert, KeyId: "openssh-test",
		ValidPrincipals: principals, ValidBefore: ssh.CertTimeInfinity}
	require.NoError(t, cert.SignCert(rand.Reader, ca.Signer))
	hostCert := filepath.Join(dir, "ssh_host_cert")
	require.NoError(t, os.WriteFile(hostCert, ssh.MarshalAuthorizedKey(cert), 0o644))
	s := &sshd{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(freeport.Port(t))), conf: filepath.Join(dir, "sshd_config")}
	_, port, _ := net.SplitHostPort(s.addr)
	require.NoError(t, os.WriteFile(s.conf, []byte(`Port `+port+`
ListenAddress 127.0.0.1
HostKey `+hostKey+`
HostCertificate `+hostCert+`
PidFile `+filepath.Join(dir, "sshd.pid")+`
UsePAM no
AuthorizedKeysFile none
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UseDNS no
LogLevel ERROR
`), 0o600))
	require.NoError(t, os.MkdirAll("/run/sshd", 0o755))
	s.log = filepath.Join(dir, "sshd.log")
	t.Cleanup(func() {
		s.kill()
		if b, _ := os.ReadFile(s.log); t.Failed() && len(b) > 0 {
			t.Logf("sshd log:\n%s", b)
		}
	})
	s.start(t)
	return s
}

func (s *sshd) start(t *testing.T) {
	t.Helper()
	s.cmd = exec.Command(sshdPath, "-D", "-f", s.conf, "-E", s.log)
	require.NoError(t, s.cmd.Start())
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", s.addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "sshd did not start")
}

func (s *sshd) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// TestRealSSHD: the check against Debian's sshd, and the Router with the
// Checker: an OpenSSH node is dialed while its sshd answers, is offline
// (the documented error) once the sshd is killed, and is back when the
// sshd is.
func TestRealSSHD(t *testing.T) {
	ca := srvtest.NewCA(t)
	d := newSSHD(t, ca, "db1", "db1."+testCluster, "127.0.0.1")

	// The check itself: the right CA and name pass; another name, or
	// another CA, do not.
	cas := []ssh.PublicKey{ca.Signer.PublicKey()}
	require.NoError(t, Check(context.Background(), CheckRequest{Node: openSSHNode("u", "db1", d.addr), HostCAs: cas}))
	err := Check(context.Background(), CheckRequest{Node: openSSHNode("u", "web1", d.addr), HostCAs: cas})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	err = Check(context.Background(), CheckRequest{Node: openSSHNode("u", "db1", d.addr), HostCAs: []ssh.PublicKey{srvtest.NewCA(t).Signer.PublicKey()}})
	require.ErrorContains(t, err, "not signed by a trusted host CA")

	clock := clockwork.NewFakeClockAt(t0)
	store, w := inventory(t, clock, openSSHNode("uuid-db1", "db1", d.addr))
	require.NoError(t, store.SetClusterNetworkingConfig(context.Background(), services.DefaultClusterNetworkingConfig()))
	ap := srvtest.NewAccessPoint()
	ap.SetCA(ca.CertAuthority(testCluster, services.HostCA))
	dialer := &countingDialer{clock: clock, dials: make(chan time.Time, 16)}
	c, err := New(Config{ClusterName: testCluster, Nodes: w, CAs: ap, Clock: clock, Dialer: dialer,
		Interval: 10 * time.Second, MinBackoff: 2 * time.Second, MaxBackoff: 8 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	router, err := proxy.NewRouter(proxy.RouterConfig{ClusterName: testCluster, NodeWatcher: w, Networking: store,
		Clock: clock, Metrics: prometheus.NewRegistry(), Health: c})
	require.NoError(t, err)
	dial := func() error {
		conn, _, err := router.DialHost(context.Background(), proxy.RouteRequest{Target: proxy.Target{Host: "db1", Port: "22"}})
		if err != nil {
			return err
		}
		defer conn.Close()
		// What the client's ssh reads first: sshd's identification.
		b := make([]byte, len("SSH-2.0-OpenSSH"))
		_, err = io.ReadFull(conn, b)
		require.NoError(t, err)
		require.Equal(t, "SSH-2.0-OpenSSH", string(b))
		return nil
	}

	updated := c.Updated()
	<-dialer.dials
	<-updated
	st, ok := c.Status("uuid-db1")
	require.True(t, ok)
	require.True(t, st.Online, st.Error)
	require.NoError(t, dial())

	d.kill()
	st = step(t, c, clock, dialer, 10*time.Second, "uuid-db1")
	require.False(t, st.Online)
	require.Contains(t, st.Error, "connection refused")
	err = dial()
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.EqualError(t, err, `node "db1" is offline: its SSH server does not answer`)

	d.start(t)
	st = step(t, c, clock, dialer, 2*time.Second, "uuid-db1")
	require.True(t, st.Online, st.Error)
	require.NoError(t, dial())
}
