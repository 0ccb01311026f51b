package web

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/gravitational/trace"
)

// Names of the generated pair inside the web TLS dir.
const (
	SelfSignedCertFile = "web.crt"
	SelfSignedKeyFile  = "web.key"
)

// selfSignedValidity is one year: long enough that a lab cluster does not
// break over a holiday, short enough that nobody mistakes it for a real
// certificate.
const selfSignedValidity = 365 * 24 * time.Hour

// LoadOrCreateTLS returns the web port's certificate: the operator's pair
// when certFile/keyFile are given, otherwise a self-signed pair kept in dir
// and generated on first start (so browsers and `psh login --insecure`
// see the same certificate across restarts).
func LoadOrCreateTLS(dir, certFile, keyFile string, hosts []string, now time.Time) (tls.Certificate, error) {
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return tls.Certificate{}, trace.BadParameter("web TLS pair %s / %s: %v", certFile, keyFile, err)
		}
		return pair, nil
	}
	certPath, keyPath := filepath.Join(dir, SelfSignedCertFile), filepath.Join(dir, SelfSignedKeyFile)
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err == nil {
		return pair, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return tls.Certificate{}, trace.BadParameter("web TLS pair in %s: %v (remove both files to generate new ones)", dir, err)
	}
	certPEM, keyPEM, err := generateSelfSigned(hosts, now)
	if err != nil {
		return tls.Certificate{}, trace.Wrap(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, trace.ConvertSystemError(err)
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, trace.ConvertSystemError(err)
	}
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
		return tls.Certificate{}, trace.ConvertSystemError(err)
	}
	pair, err = tls.X509KeyPair(certPEM, keyPEM)
	return pair, trace.Wrap(err)
}

func generateSelfSigned(hosts []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "postern proxy (self-signed)", Organization: []string{"Postern"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(selfSignedValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, h := range append([]string{"localhost", "127.0.0.1", "::1"}, hosts...) {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}
