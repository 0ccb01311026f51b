package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/sshalgo"
)

// requireSSHAudit skips without ssh-audit, except under CI, which must
// install it (Debian package ssh-audit): there the audit is the test.
func requireSSHAudit(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("ssh-audit"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("ssh-audit is not installed; CI must install it (apt-get install ssh-audit)")
		}
		t.Skipf("ssh-audit is not installed (apt-get install ssh-audit); CI installs it")
	}
}

// ssh-audit's exit codes (ssh_audit/exitcodes.py; --help does not list
// them).
const (
	auditGood            = 0
	auditConnectionError = 1
	auditWarning         = 2
	auditFailure         = 3
)

// auditReport is what ssh-audit said about one port.
type auditReport struct {
	addr string
	// code is ssh-audit's exit code.
	code int
	// text is the plain-text report; fails and warns its [fail] and
	// [warn] lines.
	text          string
	fails, warns  []string
	kex, key, enc []string
	mac           []string
}

// runSSHAudit audits addr twice: the text report (for its verdicts) and
// the JSON one (for the algorithm lists the server sent).
func runSSHAudit(t *testing.T, addr string) auditReport {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	r := auditReport{addr: addr}
	run := func(args ...string) ([]byte, int) {
		cmd := exec.Command("ssh-audit", append(args, "-t", "20", "-p", port, host)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return out.Bytes(), exit.ExitCode()
		}
		require.NoError(t, err, "ssh-audit %s", addr)
		return out.Bytes(), 0
	}
	var text []byte
	text, r.code = run("-n")
	r.text = string(text)
	for _, line := range strings.Split(r.text, "\n") {
		switch {
		case strings.Contains(line, "[fail]"):
			r.fails = append(r.fails, strings.TrimSpace(line))
		case strings.Contains(line, "[warn]"):
			r.warns = append(r.warns, strings.TrimSpace(line))
		}
	}
	if r.code == auditConnectionError {
		return r
	}
	js, _ := run("-j")
	var doc map[string]any
	require.NoError(t, json.Unmarshal(js, &doc), "ssh-audit -j %s: %s", addr, js)
	// Entries are names (ssh-audit 2.x's enc and mac) or objects with an
	// "algorithm" (kex and key, and every list in 3.x).
	names := func(key string) []string {
		var out []string
		list, _ := doc[key].([]any)
		for _, e := range list {
			switch v := e.(type) {
			case string:
				out = append(out, v)
			case map[string]any:
				out = append(out, fmt.Sprint(v["algorithm"]))
			}
		}
		return out
	}
	r.kex, r.key, r.enc, r.mac = names("kex"), names("key"), names("enc"), names("mac")
	return r
}

// requireNoFailure: no [fail] line, and no warning but ssh-audit not
// knowing an algorithm newer than itself (Debian 12's 2.5.0 predates
// mlkem768x25519-sha256 and the strict-KEX marker; later versions pass
// both).
func (r auditReport) requireNoFailure(t *testing.T, what string) {
	t.Helper()
	require.Empty(t, r.fails, "%s (%s): ssh-audit fails:\n%s", what, r.addr, r.text)
	require.NotEqual(t, auditFailure, r.code, "%s: ssh-audit exit code\n%s", what, r.text)
	require.Contains(t, []int{auditGood, auditWarning}, r.code, "%s: ssh-audit exit code\n%s", what, r.text)
	for _, w := range r.warns {
		require.True(t, strings.HasSuffix(w, "[warn] unknown algorithm"), "%s: ssh-audit warns: %q\n%s", what, w, r.text)
	}
}

// requireOffers: the lists the port sent are want (x/crypto adds its
// strict-KEX marker to a server's key exchanges), and the host key is
// the ed25519 host certificate.
func (r auditReport) requireOffers(t *testing.T, what string, want sshalgo.Lists) {
	t.Helper()
	require.Equal(t, append(want.KeyExchanges, "kex-strict-s-v00@openssh.com"), r.kex, "%s: key exchanges", what)
	require.Equal(t, want.Ciphers, r.enc, "%s: ciphers", what)
	require.Equal(t, want.MACs, r.mac, "%s: MACs", what)
	require.Equal(t, []string{ssh.CertAlgoED25519v01}, r.key, "%s: host keys", what)
}

// TestSSHAuditFindsNoFailure runs ssh-audit against every SSH port of an
// all-in-one process, the tunnel port among them: no [fail] (x/crypto's
// defaults had four on each: ecdh-sha2-nistp256/384/521 and
// hmac-sha1-96), no warning but ssh-audit's own age, and exactly the
// hardened default lists. The peer port speaks TLS, not SSH.
func TestSSHAuditFindsNoFailure(t *testing.T) {
	requireSSHAudit(t)
	c := newAllInOne(t)
	for _, l := range []struct {
		name string
		ln   string
	}{
		{"proxy SSH", service.ListenerProxySSH},
		{"node", service.ListenerNode},
		{"tunnel", service.ListenerTunnel},
	} {
		t.Run(l.name, func(t *testing.T) {
			r := runSSHAudit(t, c.p.Addr(l.ln).String())
			r.requireNoFailure(t, l.name)
			r.requireOffers(t, l.name, sshalgo.Defaults())
		})
	}
	t.Run("peer is not SSH", func(t *testing.T) {
		r := runSSHAudit(t, c.p.Addr(service.ListenerPeer).String())
		require.Equal(t, auditConnectionError, r.code, "the peer port answered ssh-audit:\n%s", r.text)
		require.Contains(t, r.text, "did not receive banner")
	})
}

// negotiated is what a client connection agreed on.
func negotiated(t *testing.T, clt *ssh.Client) ssh.NegotiatedAlgorithms {
	t.Helper()
	m, ok := clt.Conn.(ssh.AlgorithmsConnMetadata)
	require.True(t, ok)
	return m.Algorithms()
}

// opensshKex runs `ssh -v` with args and returns its output and the
// "kex: algorithm:" and "server->client cipher:" lines of each hop.
func opensshKex(t *testing.T, args ...string) (string, []string) {
	t.Helper()
	out, err := exec.Command("ssh", append([]string{"-v"}, args...)...).CombinedOutput()
	require.NoError(t, err, string(out))
	var kex []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(line, "debug1: "))
		if strings.HasPrefix(line, "kex: algorithm:") || strings.HasPrefix(line, "kex: server->client cipher:") {
			kex = append(kex, line)
		}
	}
	return string(out), kex
}

// TestDefaultAlgorithmsStillConnect: with the hardened defaults, stock
// OpenSSH (ssh -J through the proxy to the node) and x/crypto with its
// own defaults still connect, to the proxy and to the node, and agree on
// what the hardening keeps: x/crypto on the post-quantum hybrid, OpenSSH
// 9.2 (which predates it) on curve25519-sha256, both on AES-GCM.
func TestDefaultAlgorithmsStillConnect(t *testing.T) {
	c := newAllInOne(t)

	t.Run("x/crypto defaults", func(t *testing.T) {
		clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
		require.NoError(t, err)
		out, err := run(t, clt, "echo ok")
		require.NoError(t, err)
		require.Equal(t, "ok\n", out)
		got := negotiated(t, clt)
		require.Equal(t, ssh.KeyExchangeMLKEM768X25519, got.KeyExchange)
		require.Equal(t, ssh.CipherAES128GCM, got.Read.Cipher)
		require.Equal(t, ssh.CertAlgoED25519v01, got.HostKey)
	})
	t.Run("OpenSSH ssh -J", func(t *testing.T) {
		requireOpenSSH(t, "ssh")
		cfg := c.opensshConfig(t, "")
		out, kex := opensshKex(t, "-F", cfg, c.hostname, "echo jumped")
		require.Contains(t, out, "jumped\n")
		// Two hops, the proxy's and the node's, each logging both lines.
		require.Equal(t, []string{
			"kex: algorithm: curve25519-sha256",
			"kex: server->client cipher: aes128-gcm@openssh.com MAC: <implicit> compression: none",
			"kex: algorithm: curve25519-sha256",
			"kex: server->client cipher: aes128-gcm@openssh.com MAC: <implicit> compression: none",
		}, kex, out)
	})
}

// customAlgorithms share no cipher with the defaults (a CTR cipher, so
// that the MAC list is used too): a client of Postern's that ignored the
// configured lists would not connect.
var customAlgorithms = sshalgo.Lists{
	KeyExchanges: []string{ssh.KeyExchangeCurve25519},
	Ciphers:      []string{ssh.CipherAES256CTR},
	MACs:         []string{ssh.HMACSHA512ETM},
}

// TestConfiguredAlgorithmsApply: ssh_kex_algorithms, ssh_ciphers and
// ssh_macs take effect on the proxy SSH, node and tunnel ports (ssh-audit
// reads exactly them); a client offering only what the lists leave out
// is refused; clients that share an algorithm with them connect
// (x/crypto's defaults, OpenSSH's), and so do Postern's own clients,
// which send the configured lists: the web terminal to the node, and the
// tunnel agent of a node behind NAT with the same lists.
func TestConfiguredAlgorithmsApply(t *testing.T) {
	c := newAllInOneWith(t, func(cfg *config.Config) {
		cfg.SSHKexAlgorithms = customAlgorithms.KeyExchanges
		cfg.SSHCiphers = customAlgorithms.Ciphers
		cfg.SSHMACs = customAlgorithms.MACs
	})
	proxyAddr := c.p.Addr(service.ListenerProxySSH).String()
	// x/crypto adds curve25519-sha256's old name by itself.
	want := customAlgorithms
	want.KeyExchanges = []string{ssh.KeyExchangeCurve25519, sshalgo.KeyExchangeCurve25519LibSSH}

	t.Run("ssh-audit", func(t *testing.T) {
		requireSSHAudit(t)
		for _, ln := range []string{service.ListenerProxySSH, service.ListenerNode, service.ListenerTunnel} {
			r := runSSHAudit(t, c.p.Addr(ln).String())
			r.requireNoFailure(t, ln)
			r.requireOffers(t, ln, want)
		}
	})
	t.Run("x/crypto client outside the lists refused", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			set  func(*ssh.ClientConfig)
			want string
		}{
			{"mlkem768x25519-sha256", func(cfg *ssh.ClientConfig) { cfg.KeyExchanges = []string{ssh.KeyExchangeMLKEM768X25519} }, "no common algorithm for key exchange"},
			{"AES-GCM", func(cfg *ssh.ClientConfig) { cfg.Ciphers = sshalgo.Defaults().Ciphers }, "no common algorithm for client to server cipher"},
			{"hmac-sha2-256-etm", func(cfg *ssh.ClientConfig) {
				cfg.Ciphers, cfg.MACs = []string{ssh.CipherAES256CTR}, []string{ssh.HMACSHA256ETM}
			}, "no common algorithm for client to server MAC"},
		} {
			cfg := c.clientConfig(t)
			cfg.Timeout = 10 * time.Second
			tc.set(cfg)
			_, err := ssh.Dial("tcp", proxyAddr, cfg)
			require.ErrorContains(t, err, tc.want, tc.name)
		}
	})
	t.Run("x/crypto defaults connect", func(t *testing.T) {
		clt, err := c.viaJump(t, net.JoinHostPort(c.hostname, "0"))
		require.NoError(t, err)
		out, err := run(t, clt, "echo ok")
		require.NoError(t, err)
		require.Equal(t, "ok\n", out)
		got := negotiated(t, clt)
		require.Equal(t, ssh.KeyExchangeCurve25519, got.KeyExchange)
		require.Equal(t, ssh.CipherAES256CTR, got.Write.Cipher)
		require.Equal(t, ssh.HMACSHA512ETM, got.Write.MAC)
	})
	t.Run("OpenSSH", func(t *testing.T) {
		requireOpenSSH(t, "ssh")
		cfg := c.opensshConfig(t, "")
		out, kex := opensshKex(t, "-F", cfg, c.hostname, "echo jumped")
		require.Contains(t, out, "jumped\n")
		require.Equal(t, []string{
			"kex: algorithm: curve25519-sha256",
			"kex: server->client cipher: aes256-ctr MAC: hmac-sha2-512-etm@openssh.com compression: none",
			"kex: algorithm: curve25519-sha256",
			"kex: server->client cipher: aes256-ctr MAC: hmac-sha2-512-etm@openssh.com compression: none",
		}, kex, out)

		// LogLevel INFO: the refusal is not an ERROR to OpenSSH.
		out2, err := exec.Command("ssh", "-F", cfg, "-o", "LogLevel=INFO", "-o", "Ciphers=aes128-gcm@openssh.com", "proxy", "-s", "nodes").CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out2), "no matching cipher found")
		out2, err = exec.Command("ssh", "-F", cfg, "-o", "LogLevel=INFO", "-o", "MACs=hmac-sha2-256-etm@openssh.com,hmac-sha2-256", "-o", "Ciphers=aes256-ctr", "proxy", "-s", "nodes").CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out2), "no matching MAC found")
	})
	t.Run("web terminal", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		wc := webTermLogin(t, c)
		ws, _, _ := wc.open(t, ctx, c, "", "echo WEB-$((6*7))\n", regexp.MustCompile(`WEB-42`))
		ws.CloseNow()
	})
	t.Run("node behind NAT", func(t *testing.T) {
		token, pin := nodeToken(t, c.dataDir)
		cfg := procConfig(t.TempDir(), config.RoleNode)
		cfg.ProxyServer = c.p.Addr(service.ListenerWeb).String()
		cfg.Token, cfg.CAPin, cfg.NodeName = token, pin, "natted"
		cfg.SSHKexAlgorithms, cfg.SSHCiphers, cfg.SSHMACs = customAlgorithms.KeyExchanges, customAlgorithms.Ciphers, customAlgorithms.MACs
		startProcess(t, cfg)
		clt := adminClient(t, c.dataDir, c.p)
		waitNodes(t, clt, 2)
		proxy, err := ssh.Dial("tcp", proxyAddr, c.clientConfig(t))
		require.NoError(t, err)
		defer proxy.Close()
		conn, err := proxy.Dial("tcp", "natted:0")
		require.NoError(t, err)
		sconn, chans, reqs, err := ssh.NewClientConn(conn, "natted:0", c.clientConfig(t))
		require.NoError(t, err)
		node := ssh.NewClient(sconn, chans, reqs)
		defer node.Close()
		out, err := run(t, node, "echo natted")
		require.NoError(t, err)
		require.Equal(t, "natted\n", out)
	})
}

// algorithmsDaemon writes a config file with every listener on a free
// loopback port and extra appended, and returns `postern start --config`
// on it, not started.
func algorithmsDaemon(t *testing.T, extra string) (*daemon, map[string]string, string) {
	t.Helper()
	addrs := map[string]string{}
	var yaml strings.Builder
	fmt.Fprintf(&yaml, "cluster_name: %s\n", clusterName)
	for _, key := range []string{"auth_addr", "node_addr", "ssh_addr", "web_addr", "tunnel_addr", "peer_addr", "diag_addr"} {
		addrs[key] = freeport.Addr(t)
		fmt.Fprintf(&yaml, "%s: %s\n", key, addrs[key])
	}
	yaml.WriteString(extra)
	path := filepath.Join(t.TempDir(), "postern.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml.String()), 0o600))
	dataDir := filepath.Join(t.TempDir(), "data")
	d := &daemon{cmd: exec.Command(bin("postern"), "start", "--config", path, "--data-dir", dataDir), dataDir: dataDir, stderr: &syncBuffer{}, done: make(chan error, 1)}
	return d, addrs, path
}

// TestAlgorithmsFromConfigFile: the three keys in postern.yaml reach
// every SSH port of `postern start` (ssh-audit reads exactly the lists
// configured; OpenSSH offering only what they leave out is refused), and
// a name that is unknown or insecure stops `postern start` with one line
// naming the file, the key and the value, before anything is created.
func TestAlgorithmsFromConfigFile(t *testing.T) {
	t.Run("applied", func(t *testing.T) {
		requireSSHAudit(t)
		d, addrs, _ := algorithmsDaemon(t, `ssh_kex_algorithms: [curve25519-sha256]
ssh_ciphers:
  - aes256-ctr
ssh_macs: [hmac-sha2-512-etm@openssh.com]
`)
		d.cmd.Stderr = d.stderr
		require.NoError(t, d.cmd.Start())
		go func() { d.done <- d.cmd.Wait() }()
		t.Cleanup(func() {
			_ = d.cmd.Process.Kill()
			<-d.done
		})
		d.wait(t)
		want := customAlgorithms
		want.KeyExchanges = []string{ssh.KeyExchangeCurve25519, sshalgo.KeyExchangeCurve25519LibSSH}
		for _, key := range []string{"ssh_addr", "node_addr", "tunnel_addr"} {
			// The node and tunnel ports open once the proxy and node
			// roles are up, after auth answers.
			require.Eventually(t, func() bool {
				c, err := net.Dial("tcp", addrs[key])
				if err == nil {
					c.Close()
				}
				return err == nil
			}, 30*time.Second, 100*time.Millisecond, key)
			r := runSSHAudit(t, addrs[key])
			r.requireNoFailure(t, key)
			r.requireOffers(t, key, want)
		}
		// OpenSSH offering only what the file leaves out is refused.
		requireOpenSSH(t, "ssh")
		_, port, _ := net.SplitHostPort(addrs["ssh_addr"])
		for opt, msg := range map[string]string{
			"KexAlgorithms=ecdh-sha2-nistp256,diffie-hellman-group14-sha256": "no matching key exchange method found",
			"Ciphers=aes128-gcm@openssh.com,chacha20-poly1305@openssh.com":   "no matching cipher found",
		} {
			out, err := exec.Command("ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", opt, "-p", port, "127.0.0.1", "true").CombinedOutput()
			require.Error(t, err)
			require.Contains(t, string(out), msg, opt)
		}
	})
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown", "ssh_kex_algorithms: [curve25519-sha256, sntrup761x25519-sha512@openssh.com]\n", `ssh_kex_algorithms: unknown or unsupported key exchange "sntrup761x25519-sha512@openssh.com"`},
		{"insecure", "ssh_macs: [hmac-sha2-256-etm@openssh.com, hmac-sha1-96]\n", `ssh_macs: MAC "hmac-sha1-96" is insecure and not accepted`},
		{"typo", "ssh_ciphers: [aes256-gcm]\n", `ssh_ciphers: unknown or unsupported cipher "aes256-gcm"`},
	} {
		t.Run("refused "+tc.name, func(t *testing.T) {
			d, _, path := algorithmsDaemon(t, tc.yaml)
			out, err := d.cmd.CombinedOutput()
			require.Error(t, err)
			msg := strings.TrimSpace(string(out))
			require.NotContains(t, msg, "\n", "one line, no stack trace: %q", msg)
			require.Contains(t, msg, path)
			require.Contains(t, msg, tc.want)
			require.NoDirExists(t, d.dataDir, "nothing was created")
		})
	}
}
