package integration

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
)

// BenchmarkPeeredHop is issue 13's side-by-side: `ssh -J` to a node
// behind NAT whose tunnel is on proxy A, jumping through A itself (a local
// tunnel) and through proxy B (B -> peer A -> tunnel), on one cluster of
// real processes. The arms alternate within every op (and swap order on
// odd ops) so that both see the same load. "setup" is the jump up to an
// authenticated node connection (proxy TCP, kex, auth, direct-tcpip, the
// node's kex and auth): targets peered/local p50 <= 1.3. "throughput" is
// 16 MiB from the node over one established connection per arm: target
// peered/local >= 0.8.
//
//	go test -run '^$' -bench PeeredHop -benchtime 20x ./integration/
func BenchmarkPeeredHop(b *testing.B) {
	c := newAllInOne(b)
	m := joinRe.FindStringSubmatch(mustPctl(b, c.dataDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(b, m)
	pcfg := procConfig(b.TempDir(), config.RoleProxy)
	pcfg.AuthServer, pcfg.Token, pcfg.CAPin, pcfg.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], "edge-b"
	pb := startProcess(b, pcfg)

	m = joinRe.FindStringSubmatch(mustPctl(b, c.dataDir, "", "tokens", "add", "--type", "node"))
	require.NotNil(b, m)
	ncfg := procConfig(b.TempDir(), config.RoleNode)
	ncfg.ProxyServer, ncfg.Token, ncfg.CAPin, ncfg.NodeName = c.p.Addr(service.ListenerWeb).String(), m[1], m[2], "natted"
	n := startProcess(b, ncfg)
	clt := adminClient(b, c.dataDir, c.p)
	waitNodes(b, clt, 2)
	waitLease(b, clt, n.HostUUID(), c.p.HostUUID())

	cfg := benchClientConfig(b, c)
	local := c.p.Addr(service.ListenerProxySSH).String()
	peered := pb.Addr(service.ListenerProxySSH).String()

	b.Run("setup", func(b *testing.B) {
		localD := make([]time.Duration, 0, b.N)
		peerD := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			arms := []struct {
				addr string
				out  *[]time.Duration
			}{{local, &localD}, {peered, &peerD}}
			if i%2 == 1 {
				arms[0], arms[1] = arms[1], arms[0]
			}
			for _, a := range arms {
				start := time.Now()
				proxy, node, err := benchJump(cfg, a.addr, "natted:0")
				if err != nil {
					b.Fatalf("jump via %s: %v", a.addr, err)
				}
				*a.out = append(*a.out, time.Since(start))
				node.Close()
				proxy.Close()
			}
		}
		b.StopTimer()
		lp50, lp99 := percentiles(localD)
		pp50, pp99 := percentiles(peerD)
		b.ReportMetric(float64(lp50.Microseconds()), "local_p50_us")
		b.ReportMetric(float64(lp99.Microseconds()), "local_p99_us")
		b.ReportMetric(float64(pp50.Microseconds()), "peered_p50_us")
		b.ReportMetric(float64(pp99.Microseconds()), "peered_p99_us")
		b.ReportMetric(float64(pp50)/float64(lp50), "ratio_p50")
	})

	b.Run("throughput", func(b *testing.B) {
		const size = 16 << 20
		lproxy, lnode, err := benchJump(cfg, local, "natted:0")
		require.NoError(b, err)
		defer lproxy.Close()
		defer lnode.Close()
		pproxy, pnode, err := benchJump(cfg, peered, "natted:0")
		require.NoError(b, err)
		defer pproxy.Close()
		defer pnode.Close()
		var localT, peerT time.Duration
		b.SetBytes(2 * size)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			arms := []struct {
				node *ssh.Client
				out  *time.Duration
			}{{lnode, &localT}, {pnode, &peerT}}
			if i%2 == 1 {
				arms[0], arms[1] = arms[1], arms[0]
			}
			for _, a := range arms {
				start := time.Now()
				if err := pull(a.node, size); err != nil {
					b.Fatal(err)
				}
				*a.out += time.Since(start)
			}
		}
		b.StopTimer()
		mb := func(d time.Duration) float64 { return float64(b.N) * size / (1 << 20) / d.Seconds() }
		b.ReportMetric(mb(localT), "local_MiB/s")
		b.ReportMetric(mb(peerT), "peered_MiB/s")
		b.ReportMetric(mb(peerT)/mb(localT), "ratio")
	})
}

// benchJump is ssh -J with x/crypto: the proxy connection, direct-tcpip
// to target, and the node's handshake and authentication over it.
func benchJump(cfg *ssh.ClientConfig, proxyAddr, target string) (*ssh.Client, *ssh.Client, error) {
	proxy, err := ssh.Dial("tcp", proxyAddr, cfg)
	if err != nil {
		return nil, nil, err
	}
	conn, err := proxy.Dial("tcp", target)
	if err != nil {
		proxy.Close()
		return nil, nil, err
	}
	sconn, chans, reqs, err := ssh.NewClientConn(conn, target, cfg)
	if err != nil {
		proxy.Close()
		return nil, nil, err
	}
	return proxy, ssh.NewClient(sconn, chans, reqs), nil
}

// pull reads size bytes of zeros from the node's exec.
func pull(node *ssh.Client, size int64) error {
	s, err := node.NewSession()
	if err != nil {
		return err
	}
	defer s.Close()
	out, err := s.StdoutPipe()
	if err != nil {
		return err
	}
	if err := s.Start("head -c " + itoa(size) + " /dev/zero"); err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, out)
	if err != nil {
		return err
	}
	if n != size {
		return io.ErrUnexpectedEOF
	}
	return s.Wait()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// benchClientConfig is clientConfig for a benchmark: the `pctl auth sign`
// certificate, host certificates checked against the host CA.
func benchClientConfig(b *testing.B, c *allInOne) *ssh.ClientConfig {
	b.Helper()
	keyPEM, err := os.ReadFile(c.keyPath)
	require.NoError(b, err)
	signer, err := ssh.ParsePrivateKey(keyPEM)
	require.NoError(b, err)
	certBytes, err := os.ReadFile(c.keyPath + "-cert.pub")
	require.NoError(b, err)
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	require.NoError(b, err)
	certSigner, err := ssh.NewCertSigner(pub.(*ssh.Certificate), signer)
	require.NoError(b, err)
	data, err := os.ReadFile(c.keyPath + ".known_hosts")
	require.NoError(b, err)
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
	require.NotEmpty(b, cas)
	checker := &ssh.CertChecker{IsHostAuthority: func(auth ssh.PublicKey, _ string) bool {
		for _, ca := range cas {
			if bytes.Equal(ca.Marshal(), auth.Marshal()) {
				return true
			}
		}
		return false
	}}
	return &ssh.ClientConfig{User: c.login, Auth: []ssh.AuthMethod{ssh.PublicKeys(certSigner)}, HostKeyCallback: checker.CheckHostKey}
}
