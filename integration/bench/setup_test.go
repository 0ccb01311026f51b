package bench

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// BenchmarkJumpSetup is the cost of `ssh -J` through the proxy against a
// direct connection to the node, with the x/crypto client: handshake(s),
// authentication, routing, the direct-tcpip dial and one session channel.
// Each op does one of each, interleaved, so that both see the same machine
// load; the metrics are the two latencies and their ratio. (No command
// runs: a login shell's start-up would only add the same constant to both.)
func BenchmarkJumpSetup(b *testing.B) {
	c := getCluster(b)
	cr := c.creds()
	var direct, jump time.Duration
	for i := 0; i < b.N; i++ {
		d, err := setupOnce(cr, "", c.node)
		if err != nil {
			b.Fatal(err)
		}
		j, err := setupOnce(cr, c.proxy, c.node)
		if err != nil {
			b.Fatal(err)
		}
		direct += d
		jump += j
	}
	b.ReportMetric(float64(direct.Microseconds())/1000/float64(b.N), "direct-ms/op")
	b.ReportMetric(float64(jump.Microseconds())/1000/float64(b.N), "jump-ms/op")
	b.ReportMetric(float64(jump)/float64(direct), "jump/direct")
}

func setupOnce(cr credentials, proxyAddr, nodeAddr string) (time.Duration, error) {
	start := time.Now()
	h, err := dialNode(cr, proxyAddr, nodeAddr, nil)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	s, err := h.node.NewSession()
	if err != nil {
		return 0, err
	}
	d := time.Since(start)
	s.Close()
	return d, nil
}

// BenchmarkOpenSSHJumpSetup is BenchmarkJumpSetup with the real OpenSSH
// client: `ssh -J proxy bench-node true` against `ssh` straight to the
// node port, interleaved. OpenSSH sends its first packets before it sets
// TCP_NODELAY, which is where a server's delayed ACKs stall a handshake
// (utils.QuickAckConn); the x/crypto client sets TCP_NODELAY at once and
// never sees it. The login's shell start-up is in both figures: set
// POSTERN_BENCH_LOGIN to a plain account (sh, no rc files) to leave it out.
func BenchmarkOpenSSHJumpSetup(b *testing.B) {
	sshBin, err := exec.LookPath("ssh")
	if err != nil {
		b.Skip("no OpenSSH client")
	}
	c := getCluster(b)
	dir := b.TempDir()
	key := filepath.Join(dir, "key")
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(os.WriteFile(key, c.keyPEM, 0o600))
	must(os.WriteFile(key+"-cert.pub", c.certPub, 0o600))
	var kh strings.Builder
	for _, k := range c.hostCAs {
		pk, err := ssh.ParsePublicKey(k)
		must(err)
		kh.WriteString("@cert-authority * " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk))) + "\n")
	}
	must(os.WriteFile(filepath.Join(dir, "known_hosts"), []byte(kh.String()), 0o600))
	proxyHost, proxyPort, _ := net.SplitHostPort(c.proxy)
	nodeHost, nodePort, _ := net.SplitHostPort(c.node)
	login := c.login
	if l := os.Getenv(benchLoginEnv); l != "" {
		login = l
	}
	cfg := fmt.Sprintf(`Host proxy
  HostName %s
  Port %s
Host bench-node
  ProxyJump proxy
Host direct
  HostName %s
  Port %s
  HostKeyAlias bench-node
Host *
  User %s
  IdentityFile %s
  CertificateFile %s-cert.pub
  UserKnownHostsFile %s
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
`, proxyHost, proxyPort, nodeHost, nodePort, login, key, key, filepath.Join(dir, "known_hosts"))
	cfgPath := filepath.Join(dir, "ssh_config")
	must(os.WriteFile(cfgPath, []byte(cfg), 0o600))
	runSSH := func(host string) time.Duration {
		start := time.Now()
		out, err := exec.Command(sshBin, "-F", cfgPath, host, "true").CombinedOutput()
		if err != nil {
			b.Fatalf("ssh %s: %v: %s", host, err, out)
		}
		return time.Since(start)
	}
	runSSH("bench-node") // warm-up: page cache, the routing table
	var direct, jump time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct += runSSH("direct")
		jump += runSSH("bench-node")
	}
	b.ReportMetric(float64(direct.Microseconds())/1000/float64(b.N), "direct-ms/op")
	b.ReportMetric(float64(jump.Microseconds())/1000/float64(b.N), "jump-ms/op")
	b.ReportMetric(float64(jump)/float64(direct), "jump/direct")
}
