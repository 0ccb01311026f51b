package sshalgo

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// kexInit is the name-lists of an SSH_MSG_KEXINIT (RFC 4253 section
// 7.1), as one side sends them in clear before any key is agreed: what
// ssh-audit reads.
type kexInit struct {
	KeyExchanges, HostKeys, CiphersCS, CiphersSC, MACsCS, MACsSC []string
}

// readKexInit sends an identification line, skips the peer's, and reads
// the peer's first (unencrypted) packet, its KEXINIT.
func readKexInit(t *testing.T, conn net.Conn) kexInit {
	t.Helper()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err := io.WriteString(conn, "SSH-2.0-sshalgo-test\r\n")
	require.NoError(t, err)
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "SSH-") {
			break
		}
	}
	var hdr [5]byte
	_, err = io.ReadFull(r, hdr[:])
	require.NoError(t, err)
	pkt := make([]byte, binary.BigEndian.Uint32(hdr[:4])-1)
	_, err = io.ReadFull(r, pkt)
	require.NoError(t, err)
	payload := pkt[:len(pkt)-int(hdr[4])]
	require.Equal(t, byte(20), payload[0], "SSH_MSG_KEXINIT")
	rest := payload[17:] // message number and cookie
	lists := make([][]string, 6)
	for i := range lists {
		n := binary.BigEndian.Uint32(rest[:4])
		lists[i] = strings.Split(string(rest[4:4+n]), ",")
		rest = rest[4+n:]
	}
	return kexInit{lists[0], lists[1], lists[2], lists[3], lists[4], lists[5]}
}

// server serves SSH with cfg on 127.0.0.1 until the test ends; every
// connection's handshake result goes to the returned channel.
func server(t *testing.T, cfg *ssh.ServerConfig) (string, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	results := make(chan error, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer nc.Close()
				_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
				sconn, chans, reqs, err := ssh.NewServerConn(nc, cfg)
				results <- err
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				go func() {
					for ch := range chans {
						_ = ch.Reject(ssh.Prohibited, "test")
					}
				}()
				_ = sconn.Wait()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String(), results
}

// hostCert is signer with a host certificate from a throwaway CA: what
// Postern's hosts present, and all its clients accept.
func hostCert(t *testing.T, signer ssh.Signer) ssh.Signer {
	t.Helper()
	cert := &ssh.Certificate{Key: signer.PublicKey(), CertType: ssh.HostCert, ValidPrincipals: []string{"host"}, ValidBefore: ssh.CertTimeInfinity}
	require.NoError(t, cert.SignCert(rand.Reader, ed25519Signer(t)))
	cs, err := ssh.NewCertSigner(cert, signer)
	require.NoError(t, err)
	return cs
}

func ed25519Signer(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	s, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return s
}

func rsaSigner(t *testing.T) ssh.Signer {
	t.Helper()
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	s, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return s
}

// defaultServer is a server with the default lists, an ed25519 and an
// RSA host key with their certificates, accepting user key userKey.
func defaultServer(t *testing.T, userKey ssh.PublicKey) (string, <-chan error) {
	t.Helper()
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
		if userKey != nil && string(key.Marshal()) == string(userKey.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("unknown key")
	}}
	ed, rsaKey := ed25519Signer(t), rsaSigner(t)
	require.NoError(t, Lists{}.ServerConfig(cfg, hostCert(t, ed), hostCert(t, rsaKey), ed, rsaKey))
	return server(t, cfg)
}

// TestServerOffersOnlyTheDefaults reads what a server with the default
// lists announces, as ssh-audit does: the hardened lists and nothing else
// (x/crypto adds its strict-KEX marker), and an RSA host key offered as
// rsa-sha2-256/512 only, never ssh-rsa.
func TestServerOffersOnlyTheDefaults(t *testing.T) {
	addr, _ := defaultServer(t, nil)
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	got := readKexInit(t, conn)
	require.Equal(t, []string{"mlkem768x25519-sha256", "curve25519-sha256", "curve25519-sha256@libssh.org", "kex-strict-s-v00@openssh.com"}, got.KeyExchanges)
	require.Equal(t, []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com"}, got.CiphersCS)
	require.Equal(t, got.CiphersCS, got.CiphersSC)
	require.Equal(t, []string{"hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com"}, got.MACsCS)
	require.Equal(t, got.MACsCS, got.MACsSC)
	require.Equal(t, []string{"ssh-ed25519-cert-v01@openssh.com", "rsa-sha2-256-cert-v01@openssh.com", "rsa-sha2-512-cert-v01@openssh.com", "ssh-ed25519", "rsa-sha2-256", "rsa-sha2-512"}, got.HostKeys)
}

// TestClientOffersOnlyTheDefaults reads what a client configured here
// announces: the same lists, and host certificates of ed25519 and
// RSA/SHA-2 only.
func TestClientOffersOnlyTheDefaults(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			done <- err
			return
		}
		defer nc.Close()
		cfg := Lists{}.ClientConfig(&ssh.ClientConfig{User: "u", HostKeyCallback: ssh.InsecureIgnoreHostKey()})
		_, _, _, err = ssh.NewClientConn(nc, "x", cfg)
		done <- err
	}()
	conn, err := ln.Accept()
	require.NoError(t, err)
	got := readKexInit(t, conn)
	conn.Close()
	require.Error(t, <-done)
	require.Equal(t, []string{"mlkem768x25519-sha256", "curve25519-sha256", "curve25519-sha256@libssh.org", "ext-info-c", "kex-strict-c-v00@openssh.com"}, got.KeyExchanges)
	require.Equal(t, []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com"}, got.CiphersCS)
	require.Equal(t, []string{"hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com"}, got.MACsCS)
	require.Equal(t, []string{"ssh-ed25519-cert-v01@openssh.com", "rsa-sha2-512-cert-v01@openssh.com", "rsa-sha2-256-cert-v01@openssh.com"}, got.HostKeys)
}

// dial runs a client handshake with cfg against addr and returns the
// client's error and the server's.
func dial(t *testing.T, addr string, results <-chan error, cfg *ssh.ClientConfig) (clientErr, serverErr error) {
	t.Helper()
	cfg.Timeout = 10 * time.Second
	clt, err := ssh.Dial("tcp", addr, cfg)
	if err == nil {
		clt.Close()
	}
	return err, <-results
}

// TestDowngradesRefused is the attack: a client that offers only what
// x/crypto supports by default but the hardening removed (a NIST curve,
// SHA-1 Diffie-Hellman, a CTR cipher with a SHA-1 or non-EtM MAC, an
// ssh-rsa host key, an ssh-rsa user signature) gets no connection; the
// same client with the defaults, and one with x/crypto's own defaults,
// connects.
func TestDowngradesRefused(t *testing.T) {
	user := ed25519Signer(t)
	rsaUser := rsaSigner(t)
	addr, results := defaultServer(t, user.PublicKey())
	raddr, rresults := defaultServer(t, rsaUser.PublicKey())
	base := func(auth ssh.Signer) *ssh.ClientConfig {
		return &ssh.ClientConfig{User: "u", Auth: []ssh.AuthMethod{ssh.PublicKeys(auth)}, HostKeyCallback: ssh.InsecureIgnoreHostKey()}
	}

	t.Run("defaults connect", func(t *testing.T) {
		cerr, serr := dial(t, addr, results, Lists{}.ClientConfig(base(user)))
		require.NoError(t, cerr)
		require.NoError(t, serr)
	})
	t.Run("x/crypto defaults connect", func(t *testing.T) {
		cerr, serr := dial(t, addr, results, base(user))
		require.NoError(t, cerr)
		require.NoError(t, serr)
	})
	t.Run("RSA user key with SHA-2 connects", func(t *testing.T) {
		cerr, serr := dial(t, raddr, rresults, base(rsaUser))
		require.NoError(t, cerr)
		require.NoError(t, serr)
	})
	for _, tc := range []struct {
		name string
		set  func(*ssh.ClientConfig)
		want string
	}{
		{"ecdh-sha2-nistp256", func(c *ssh.ClientConfig) { c.KeyExchanges = []string{ssh.KeyExchangeECDHP256} }, "key exchange"},
		{"ecdh-sha2-nistp521", func(c *ssh.ClientConfig) { c.KeyExchanges = []string{ssh.KeyExchangeECDHP521} }, "key exchange"},
		{"diffie-hellman-group14-sha1", func(c *ssh.ClientConfig) { c.KeyExchanges = []string{ssh.InsecureKeyExchangeDH14SHA1} }, "key exchange"},
		{"diffie-hellman-group14-sha256", func(c *ssh.ClientConfig) { c.KeyExchanges = []string{ssh.KeyExchangeDH14SHA256} }, "key exchange"},
		{"chacha20-poly1305", func(c *ssh.ClientConfig) { c.Ciphers = []string{ssh.CipherChaCha20Poly1305} }, "client to server cipher"},
		{"aes128-ctr", func(c *ssh.ClientConfig) { c.Ciphers = []string{ssh.CipherAES128CTR} }, "client to server cipher"},
		{"ssh-rsa host key", func(c *ssh.ClientConfig) { c.HostKeyAlgorithms = []string{ssh.KeyAlgoRSA} }, "host key"},
	} {
		t.Run(tc.name+" refused", func(t *testing.T) {
			cfg := base(user)
			tc.set(cfg)
			cerr, serr := dial(t, addr, results, cfg)
			require.ErrorContains(t, cerr, "no common algorithm for "+tc.want)
			require.ErrorContains(t, serr, "no common algorithm for "+tc.want)
		})
	}
	t.Run("ssh-rsa user signature refused", func(t *testing.T) {
		sha1Only, err := ssh.NewSignerWithAlgorithms(rsaUser.(ssh.AlgorithmSigner), []string{ssh.KeyAlgoRSA})
		require.NoError(t, err)
		cerr, serr := dial(t, raddr, rresults, base(sha1Only))
		require.ErrorContains(t, cerr, "unable to authenticate")
		require.Error(t, serr)
	})
}

// TestConfiguredListsApply: a server configured with CTR and one MAC
// offers exactly those, and a client offering another MAC is refused.
func TestConfiguredListsApply(t *testing.T) {
	user := ed25519Signer(t)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) { return nil, nil }}
	lists := Lists{KeyExchanges: []string{ssh.KeyExchangeCurve25519}, Ciphers: []string{ssh.CipherAES256CTR}, MACs: []string{ssh.HMACSHA512ETM}}
	require.NoError(t, lists.ServerConfig(cfg, hostCert(t, ed25519Signer(t))))
	addr, results := server(t, cfg)

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	got := readKexInit(t, conn)
	conn.Close()
	require.NotNil(t, <-results)
	// x/crypto adds the pre-RFC name of curve25519-sha256 by itself.
	require.Equal(t, []string{"curve25519-sha256", "curve25519-sha256@libssh.org", "kex-strict-s-v00@openssh.com"}, got.KeyExchanges)
	require.Equal(t, []string{"aes256-ctr"}, got.CiphersSC)
	require.Equal(t, []string{"hmac-sha2-512-etm@openssh.com"}, got.MACsSC)

	base := func() *ssh.ClientConfig {
		return &ssh.ClientConfig{User: "u", Auth: []ssh.AuthMethod{ssh.PublicKeys(user)}, HostKeyCallback: ssh.InsecureIgnoreHostKey()}
	}
	cerr, serr := dial(t, addr, results, lists.ClientConfig(base()))
	require.NoError(t, cerr)
	require.NoError(t, serr)
	other := base()
	other.MACs = []string{ssh.HMACSHA256ETM}
	cerr, _ = dial(t, addr, results, other)
	require.ErrorContains(t, cerr, "no common algorithm for client to server MAC")
	// The defaults (AES-GCM only) do not meet a CTR-only server.
	cerr, _ = dial(t, addr, results, Lists{}.ClientConfig(base()))
	require.ErrorContains(t, cerr, "no common algorithm for client to server cipher")
}

func TestCheck(t *testing.T) {
	require.NoError(t, Check(KeyExchanges, Defaults().KeyExchanges))
	require.NoError(t, Check(Ciphers, Defaults().Ciphers))
	require.NoError(t, Check(MACs, Defaults().MACs))
	// Wider than the defaults, for an old client: accepted.
	require.NoError(t, Check(KeyExchanges, []string{"ecdh-sha2-nistp256", "diffie-hellman-group16-sha512"}))
	require.NoError(t, Check(Ciphers, []string{"aes256-ctr", "chacha20-poly1305@openssh.com"}))
	require.NoError(t, Check(MACs, []string{"hmac-sha1"}))

	for _, tc := range []struct {
		kind Kind
		list []string
		want string
	}{
		{KeyExchanges, []string{"curve25519-sha256", "sntrup761x25519-sha512@openssh.com"}, `unknown or unsupported key exchange "sntrup761x25519-sha512@openssh.com": want some of mlkem768x25519-sha256, curve25519-sha256,`},
		{KeyExchanges, []string{"diffie-hellman-group14-sha1"}, `key exchange "diffie-hellman-group14-sha1" is insecure and not accepted`},
		{Ciphers, []string{"aes128-cbc"}, `cipher "aes128-cbc" is insecure and not accepted`},
		{Ciphers, []string{"aes128-gcm"}, `unknown or unsupported cipher "aes128-gcm"`},
		{MACs, []string{"hmac-sha1-96"}, `MAC "hmac-sha1-96" is insecure and not accepted`},
		{MACs, []string{"hmac-md5"}, `unknown or unsupported MAC "hmac-md5"`},
		{MACs, []string{"hmac-sha2-256-etm@openssh.com", "hmac-sha2-256-etm@openssh.com"}, `MAC "hmac-sha2-256-etm@openssh.com" is listed twice`},
	} {
		err := Check(tc.kind, tc.list)
		require.ErrorContains(t, err, tc.want)
	}
}

// TestAllSupportedMeetsAnyAcceptedList: the host key probe's lists agree
// with a server configured with any single name Check accepts.
func TestAllSupportedMeetsAnyAcceptedList(t *testing.T) {
	all := AllSupported()
	for _, k := range []Kind{KeyExchanges, Ciphers, MACs} {
		ok, _ := accepted(k)
		for _, n := range ok {
			require.NoError(t, Check(k, []string{n}))
		}
	}
	require.Contains(t, all.KeyExchanges, KeyExchangeCurve25519LibSSH)
	require.NotContains(t, all.KeyExchanges, ssh.InsecureKeyExchangeDH14SHA1)
	require.NotContains(t, all.MACs, ssh.InsecureHMACSHA196)
}
