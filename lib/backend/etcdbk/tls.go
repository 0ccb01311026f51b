package etcdbk

import (
	"crypto/tls"
	"crypto/x509"
	"os"

	"github.com/gravitational/trace"
)

// LoadTLS builds the client TLS config of backend.etcd_tls from PEM files:
// caFile is the CA that signed etcd's server certificates (it replaces the
// system roots: an etcd is never vouched for by a public CA), certFile and
// keyFile the client certificate etcd's --client-cert-auth checks. The CA
// alone is allowed (server-authenticated TLS); a certificate without its key,
// or the reverse, is not. Each error names the file that was wrong.
func LoadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, trace.BadParameter("backend.etcd_tls: missing ca_file (the CA of the etcd servers' certificates)")
	}
	if (certFile == "") != (keyFile == "") {
		return nil, trace.BadParameter("backend.etcd_tls: cert_file and key_file go together: set both or neither")
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, trace.BadParameter("backend.etcd_tls: ca_file %s: %v", caFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, trace.BadParameter("backend.etcd_tls: ca_file %s holds no PEM certificate", caFile)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, trace.BadParameter("backend.etcd_tls: cert_file %s / key_file %s: %v", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
