// Package sshalgo is the one place that decides which SSH algorithms
// Postern negotiates: the defaults every server (proxy SSH, node, tunnel
// port) and every client Postern dials with (psh, the web terminal, the
// tunnel agents, psh bench) offer, the checks on a configured list
// (ssh_kex_algorithms, ssh_ciphers, ssh_macs), and the host key and user
// key signature algorithms, which are not configurable.
//
// x/crypto's own defaults are not used anywhere: they keep the NIST ECDH
// curves, diffie-hellman-group14-sha1, hmac-sha1, hmac-sha1-96 and the
// non-EtM MACs for compatibility, which ssh-audit fails or warns about
// and a hardening guide removes. Servers and clients take their lists
// from here, so a client of ours always agrees with a server of ours.
package sshalgo

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"
)

// KeyExchangeCurve25519LibSSH is curve25519-sha256's pre-RFC name, for
// OpenSSH before 7.4. x/crypto does not export it; it adds it by itself
// after curve25519-sha256 in any list that names that.
const KeyExchangeCurve25519LibSSH = "curve25519-sha256@libssh.org"

// Defaults, in preference order (a server takes the client's order; a
// client of ours sends this one).
var (
	// defaultKeyExchanges: the post-quantum hybrid first (ML-KEM-768 with
	// X25519, in x/crypto since Go 1.24, OpenSSH since 9.9), then X25519
	// alone, under both of its names. The NIST curves, whose constants
	// nobody can explain, and SHA-1 or short-group Diffie-Hellman are
	// left out.
	defaultKeyExchanges = []string{ssh.KeyExchangeMLKEM768X25519, ssh.KeyExchangeCurve25519, KeyExchangeCurve25519LibSSH}
	// defaultCiphers: AES-GCM only. chacha20-poly1305@openssh.com is
	// sound (ssh-audit passes it, and x/crypto does strict KEX, so
	// Terrapin does not apply), but x/crypto runs ChaCha20 without
	// assembly on amd64, about half AES-GCM's speed with AES-NI, and
	// OpenSSH lists it first: offered, it would be what every OpenSSH
	// client picks, for every byte through the proxy. The CTR ciphers
	// need a MAC on top, which cost the proxy twice the CPU per GB
	// (bench/postern-vs-openssh.sh). Every client of the last decade
	// speaks AES-GCM (OpenSSH 6.2, PuTTY 0.76, libssh2 1.11).
	defaultCiphers = []string{ssh.CipherAES128GCM, ssh.CipherAES256GCM}
	// defaultMACs: encrypt-then-MAC with SHA-2 only. With the AES-GCM
	// ciphers no MAC is used at all (GCM authenticates); the list is what
	// is offered with a CTR cipher an operator configures.
	defaultMACs = []string{ssh.HMACSHA256ETM, ssh.HMACSHA512ETM}
)

// hostKeyAlgorithms is what Postern's clients accept from a server:
// certificates only (every Postern client checks the server's host
// certificate against the host CA, so a plain key would be refused
// anyway), ed25519 (the keys Postern makes) first, then RSA with SHA-2.
// ssh-rsa (SHA-1 signatures) and the NIST curves are not offered.
var hostKeyAlgorithms = []string{ssh.CertAlgoED25519v01, ssh.CertAlgoRSASHA512v01, ssh.CertAlgoRSASHA256v01}

// rsaSignatures are the signature algorithms an RSA host key of ours
// signs with: SHA-2 only, never ssh-rsa's SHA-1.
var rsaSignatures = []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256}

// Lists are the configurable algorithm lists of one process, in
// preference order. An empty list means the default one.
type Lists struct {
	KeyExchanges []string
	Ciphers      []string
	MACs         []string
}

// Defaults returns the default lists (copies: callers may change them).
func Defaults() Lists {
	return Lists{
		KeyExchanges: slices.Clone(defaultKeyExchanges),
		Ciphers:      slices.Clone(defaultCiphers),
		MACs:         slices.Clone(defaultMACs),
	}
}

// WithDefaults returns l with each empty list replaced by its default.
func (l Lists) WithDefaults() Lists {
	d := Defaults()
	if len(l.KeyExchanges) > 0 {
		d.KeyExchanges = slices.Clone(l.KeyExchanges)
	}
	if len(l.Ciphers) > 0 {
		d.Ciphers = slices.Clone(l.Ciphers)
	}
	if len(l.MACs) > 0 {
		d.MACs = slices.Clone(l.MACs)
	}
	return d
}

// Config is an ssh.Config offering l (the defaults for an empty list).
func (l Lists) Config() ssh.Config {
	l = l.WithDefaults()
	return ssh.Config{KeyExchanges: l.KeyExchanges, Ciphers: l.Ciphers, MACs: l.MACs}
}

// ClientConfig sets cfg's algorithm lists to l and its host key
// algorithms to HostKeyAlgorithms, keeping the rest of cfg.
func (l Lists) ClientConfig(cfg *ssh.ClientConfig) *ssh.ClientConfig {
	rest := cfg.Config
	cfg.Config = l.Config()
	cfg.Rand, cfg.RekeyThreshold = rest.Rand, rest.RekeyThreshold
	cfg.HostKeyAlgorithms = HostKeyAlgorithms()
	return cfg
}

// ServerConfig sets cfg's algorithm lists to l, refuses ssh-rsa (SHA-1)
// signatures in user authentication, and adds the host keys, an RSA one
// restricted to SHA-2 signatures (AddHostKey would offer ssh-rsa too).
func (l Lists) ServerConfig(cfg *ssh.ServerConfig, hostKeys ...ssh.Signer) error {
	rest := cfg.Config
	cfg.Config = l.Config()
	cfg.Rand, cfg.RekeyThreshold = rest.Rand, rest.RekeyThreshold
	cfg.PublicKeyAuthAlgorithms = PublicKeyAuthAlgorithms()
	for _, k := range hostKeys {
		k, err := HostKey(k)
		if err != nil {
			return trace.Wrap(err)
		}
		cfg.AddHostKey(k)
	}
	return nil
}

// HostKeyAlgorithms is the host key preference of Postern's clients.
func HostKeyAlgorithms() []string { return slices.Clone(hostKeyAlgorithms) }

// PublicKeyAuthAlgorithms are the signatures Postern's servers accept in
// user authentication: x/crypto's supported ones, which leave out ssh-rsa
// (SHA-1). An RSA user key still works with rsa-sha2-256/512, which every
// OpenSSH since 7.2 uses.
func PublicKeyAuthAlgorithms() []string { return ssh.SupportedAlgorithms().PublicKeyAuths }

// HostKey returns signer as a host key that never signs with SHA-1: an
// RSA key (or certificate) is restricted to rsa-sha2-512 and
// rsa-sha2-256; any other key is returned as it is.
func HostKey(signer ssh.Signer) (ssh.Signer, error) {
	pub := signer.PublicKey()
	if cert, ok := pub.(*ssh.Certificate); ok {
		pub = cert.Key
	}
	if pub.Type() != ssh.KeyAlgoRSA {
		return signer, nil
	}
	as, ok := signer.(ssh.AlgorithmSigner)
	if !ok {
		// It could only sign ssh-rsa.
		return nil, trace.BadParameter("RSA host key %s cannot sign with SHA-2 (rsa-sha2-256/512): use an ed25519 key", ssh.FingerprintSHA256(signer.PublicKey()))
	}
	ms, err := ssh.NewSignerWithAlgorithms(as, rsaSignatures)
	if err != nil {
		return nil, trace.Wrap(err, "restricting the RSA host key to SHA-2 signatures")
	}
	return ms, nil
}

// Kind is one configurable list.
type Kind int

// The configurable lists.
const (
	KeyExchanges Kind = iota
	Ciphers
	MACs
)

func (k Kind) String() string {
	switch k {
	case KeyExchanges:
		return "key exchange"
	case Ciphers:
		return "cipher"
	case MACs:
		return "MAC"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// accepted are the names a configured list may hold, by kind: what
// x/crypto implements without known weaknesses (its SupportedAlgorithms),
// so that an operator may widen the list for an old client (ecdh-sha2-*,
// the CTR ciphers, hmac-sha1) but never to what x/crypto itself calls
// insecure.
func accepted(k Kind) (ok, insecure []string) {
	sup, bad := ssh.SupportedAlgorithms(), ssh.InsecureAlgorithms()
	switch k {
	case KeyExchanges:
		// The libssh alias is implemented but not listed.
		return append(sup.KeyExchanges, KeyExchangeCurve25519LibSSH), bad.KeyExchanges
	case Ciphers:
		return sup.Ciphers, bad.Ciphers
	default:
		return sup.MACs, bad.MACs
	}
}

// Check validates a configured list of kind k: every name must be one
// x/crypto implements without known weaknesses, and none twice. The
// error names the offending value and what is accepted; the caller adds
// the config key.
func Check(k Kind, names []string) error {
	ok, insecure := accepted(k)
	seen := map[string]bool{}
	for _, n := range names {
		switch {
		case slices.Contains(insecure, n):
			return trace.BadParameter("%s %q is insecure and not accepted: want some of %s", k, n, strings.Join(ok, ", "))
		case !slices.Contains(ok, n):
			return trace.BadParameter("unknown or unsupported %s %q: want some of %s", k, n, strings.Join(ok, ", "))
		case seen[n]:
			return trace.BadParameter("%s %q is listed twice", k, n)
		}
		seen[n] = true
	}
	return nil
}

// AllSupported is every algorithm x/crypto implements without known
// weaknesses, for a client that only proves a server's host key and must
// agree with whatever lists that server was configured with (Check
// accepts no other names). Nothing is sent over such a connection.
func AllSupported() Lists {
	kex, _ := accepted(KeyExchanges)
	ciphers, _ := accepted(Ciphers)
	macs, _ := accepted(MACs)
	return Lists{KeyExchanges: kex, Ciphers: ciphers, MACs: macs}
}
