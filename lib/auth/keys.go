package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/utils"
)

// TLSCAValidity is the lifetime of a cluster's X.509 CA. Ten years: there is
// no CA rotation yet, so the CA must outlive any realistic deployment, and
// every certificate it signs is bounded by it.
const TLSCAValidity = 10 * 365 * 24 * time.Hour

// clockSkew is subtracted from every NotBefore/ValidAfter so that a peer
// whose clock runs a little behind ours still accepts a fresh certificate.
const clockSkew = time.Minute

// generateTLSKey makes the ECDSA P-256 key used for X.509 identities: every
// TLS stack (and every HSM, should one come) handles P-256.
func generateTLSKey() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseTLSPrivateKey reads a PEM private key in PKCS#8, SEC1 or PKCS#1 form.
func parseTLSPrivateKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, trace.BadParameter("no PEM block found in private key")
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
		return nil, trace.BadParameter("unsupported private key type %T", k)
	}
	if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	return nil, trace.BadParameter("unsupported or corrupt private key (PEM type %q)", block.Type)
}

// parseCertPEM reads the first certificate of a PEM blob.
func parseCertPEM(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, trace.BadParameter("no PEM CERTIFICATE block found")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, trace.BadParameter("invalid certificate: %v", err)
	}
	return cert, nil
}

// parseCertsPEM reads every certificate in a PEM blob.
func parseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, trace.BadParameter("invalid certificate: %v", err)
		}
		out = append(out, cert)
	}
	if len(out) == 0 {
		return nil, trace.BadParameter("no PEM CERTIFICATE block found")
	}
	return out, nil
}

// parsePublicKey accepts a PKIX public key as DER or as a PEM "PUBLIC KEY"
// block: the join request allows both so that a shell script can send
// `openssl pkey -pubout` output as is.
func parsePublicKey(data []byte) (crypto.PublicKey, error) {
	der := data
	if block, _ := pem.Decode(data); block != nil {
		der = block.Bytes
	}
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, trace.BadParameter("invalid TLS public key: %v", err)
	}
	switch pub.(type) {
	case *ecdsa.PublicKey, ed25519.PublicKey:
		return pub, nil
	}
	return nil, trace.BadParameter("unsupported TLS public key type %T (want ECDSA or ed25519)", pub)
}

func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return serial, nil
}

// newTLSCA makes a self-signed X.509 CA for the cluster.
func newTLSCA(clusterName string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, keyPEM, err := generateTLSKey()
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: clusterName, Organization: []string{clusterName}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(TLSCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// The CA signs leaves only, never an intermediate.
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// tlsCertRequest describes one leaf certificate.
type tlsCertRequest struct {
	publicKey crypto.PublicKey
	id        string
	role      string
	cluster   string
	// server adds ExtKeyUsageServerAuth. Only the auth server's own
	// certificate gets it: node, proxy and admin certificates are client
	// certificates only, so a compromised node cannot pose as the auth
	// server to its peers even though its certificate chains to the same CA.
	server   bool
	dnsNames []string
	ips      []net.IP
	notAfter time.Time
}

// signTLSCert signs a leaf. The subject encodes the identity: CN is the ID,
// O the role, OU the cluster; the API server reads them back on every request.
func signTLSCert(caCert *x509.Certificate, caKey crypto.Signer, req tlsCertRequest, now time.Time) ([]byte, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if req.server {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	notAfter := req.notAfter
	if notAfter.IsZero() || notAfter.After(caCert.NotAfter) {
		notAfter = caCert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:         req.id,
			Organization:       []string{req.role},
			OrganizationalUnit: []string{req.cluster},
		},
		NotBefore:   now.Add(-clockSkew),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: usage,
		DNSNames:    req.dnsNames,
		IPAddresses: req.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, req.publicKey, caKey)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// CAPinPrefix starts every CA pin.
const CAPinPrefix = "sha256:"

// CAPin returns the pin of a TLS CA certificate (PEM): "sha256:" followed
// by the hex SHA-256 of its SubjectPublicKeyInfo. Pinning the key rather
// than the whole certificate is what `--ca-pin` promises: a CA re-issued
// with the same key (a longer validity, say) keeps the pin valid.
func CAPin(tlsCACertPEM []byte) (string, error) {
	cert, err := parseCertPEM(tlsCACertPEM)
	if err != nil {
		return "", trace.Wrap(err)
	}
	return caPinOf(cert), nil
}

func caPinOf(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return CAPinPrefix + hex.EncodeToString(sum[:])
}

// checkCAPin validates the syntax of a pin given by an operator.
func checkCAPin(pin string) error {
	hexPart, ok := strings.CutPrefix(pin, CAPinPrefix)
	if !ok {
		return trace.BadParameter("invalid CA pin %q: expected %sHEX", pin, CAPinPrefix)
	}
	if b, err := hex.DecodeString(hexPart); err != nil || len(b) != sha256.Size {
		return trace.BadParameter("invalid CA pin %q: expected %s followed by 64 hex digits", pin, CAPinPrefix)
	}
	return nil
}

// newSSHCA makes an ed25519 SSH CA key: authorized_keys line (no newline)
// and OpenSSH PEM private key.
func newSSHCA() (pub string, priv []byte, err error) {
	privPEM, pubBytes, err := utils.GenerateKeyPair()
	if err != nil {
		return "", nil, trace.Wrap(err)
	}
	return strings.TrimSpace(string(pubBytes)), privPEM, nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
