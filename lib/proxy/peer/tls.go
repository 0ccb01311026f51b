package peer

import (
	"crypto/tls"
	"crypto/x509"
	"time"

	"github.com/gravitational/trace"
)

// Identity is what both ends of a peer connection present and check.
type Identity struct {
	// UUID is this proxy's ID (its certificate's CN). Required.
	UUID string
	// ClusterName is the cluster a peer's certificate must be for (OU).
	// Required.
	ClusterName string
	// Certificate is this proxy's TLS identity (role proxy). Required.
	Certificate tls.Certificate
	// CAPool returns the cluster's TLS CA certificates, read on every
	// handshake. Required.
	CAPool func() *x509.CertPool
}

func (id *Identity) check() error {
	switch {
	case id.UUID == "":
		return trace.BadParameter("peer: missing UUID")
	case id.ClusterName == "":
		return trace.BadParameter("peer: missing ClusterName")
	case len(id.Certificate.Certificate) == 0:
		return trace.BadParameter("peer: missing Certificate")
	case id.CAPool == nil:
		return trace.BadParameter("peer: missing CAPool")
	}
	return nil
}

// verifyPeer is the peer port's admission rule, on both ends: a
// certificate chain to the cluster's TLS CA, valid at now, role proxy, this
// cluster. It returns the peer's UUID. want, when set, is the UUID the
// dialer meant to reach.
func verifyPeer(cs tls.ConnectionState, roots *x509.CertPool, cluster, want string, now time.Time) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", trace.AccessDenied("no certificate presented")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return "", trace.AccessDenied("certificate %q is not a valid identity of this cluster: %v", leaf.Subject.CommonName, err)
	}
	s := leaf.Subject
	if s.CommonName == "" || len(s.Organization) != 1 || len(s.OrganizationalUnit) != 1 {
		return "", trace.AccessDenied("certificate %q is not a Postern identity", s.String())
	}
	if s.OrganizationalUnit[0] != cluster {
		return "", trace.AccessDenied("certificate %q is for cluster %q, not %q", s.CommonName, s.OrganizationalUnit[0], cluster)
	}
	if role := s.Organization[0]; role != RoleProxy {
		return "", trace.AccessDenied("certificate %q has role %q, only %q may peer", s.CommonName, role, RoleProxy)
	}
	if want != "" && s.CommonName != want {
		return "", trace.AccessDenied("peer presented the certificate of proxy %q, expected proxy %q", s.CommonName, want)
	}
	return s.CommonName, nil
}
