package etcdbk

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

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

// probe says why no endpoint answered, when the etcd client only reports
// a timeout: gRPC retries a refused connection or a failed TLS handshake
// until the deadline, and "context deadline exceeded" alone sends an
// operator looking in the wrong place. It dials each endpoint once (and
// handshakes, with TLS) and returns the reasons, or "" when every endpoint
// accepts (then the trouble is etcd itself: no quorum, a slow disk).
func probe(ctx context.Context, cfg Config) string {
	var why []string
	for _, ep := range cfg.Endpoints {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			why = append(why, ep+": not a URL")
			continue
		}
		d := net.Dialer{Timeout: 2 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			why = append(why, ep+": "+unwrapNetError(err))
			continue
		}
		if cfg.TLS != nil {
			tc := cfg.TLS.Clone()
			if tc.ServerName == "" {
				tc.ServerName = u.Hostname()
			}
			tconn := tls.Client(conn, tc)
			_ = tconn.SetDeadline(time.Now().Add(2 * time.Second))
			err = tconn.Handshake()
			if err == nil {
				// TLS 1.3 reports a refused client certificate only on
				// the first read.
				_, err = tconn.Read(make([]byte, 1))
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					err = nil
				}
			}
			if err != nil {
				why = append(why, ep+": TLS: "+err.Error())
			}
		} else if u.Scheme == "https" {
			why = append(why, ep+": https endpoint without backend.etcd_tls")
		}
		conn.Close()
	}
	return strings.Join(why, "; ")
}

func unwrapNetError(err error) string {
	if oe, ok := err.(*net.OpError); ok && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}
