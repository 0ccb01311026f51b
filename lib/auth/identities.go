package auth

import (
	"context"
	"crypto"
	"crypto/x509"
	"net"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/utils"
)

// IdentityRequest asks the auth server to mint a whole identity, keys
// included. It is for processes that share the auth server's trust (the
// all-in-one daemon's own node and proxy, the admin identity); remote hosts
// join with a token instead and keep their private keys to themselves.
type IdentityRequest struct {
	// ID is the host UUID (or AuthIdentityID / AdminIdentityID).
	ID string
	// Role is RoleNode, RoleProxy, RoleAuth or RoleAdmin.
	Role string
	// Hostname becomes an SSH principal.
	Hostname string
	// Principals are extra SSH principals (IPs, public names).
	Principals []string
}

// IssueIdentity generates keys and certificates for req.
func (s *Server) IssueIdentity(ctx context.Context, req IdentityRequest) (*Identity, error) {
	return s.issueIdentity(ctx, req, nil, nil)
}

// issueIdentity does IssueIdentity; dnsNames/ips are TLS server SANs and are
// only honoured for RoleAuth.
func (s *Server) issueIdentity(ctx context.Context, req IdentityRequest, dnsNames []string, ips []net.IP) (*Identity, error) {
	if err := checkName("identity ID", req.ID); err != nil {
		return nil, trace.Wrap(err)
	}
	var files IdentityFiles
	if req.Role != RoleAdmin {
		sshKey, sshPub, err := utils.GenerateKeyPair()
		if err != nil {
			return nil, trace.Wrap(err)
		}
		sshCert, err := s.GenerateHostCert(ctx, HostCertRequest{
			PublicKey:  sshPub,
			UUID:       req.ID,
			Hostname:   req.Hostname,
			Principals: req.Principals,
			Role:       req.Role,
		})
		if err != nil {
			return nil, trace.Wrap(err)
		}
		files.SSHKey, files.SSHCert = sshKey, sshCert
	}
	tlsKey, tlsKeyPEM, err := generateTLSKey()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	tlsCert, err := s.signIdentityTLS(tlsKey.Public(), req.ID, req.Role, dnsNames, ips)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	files.TLSCert, files.TLSKey = tlsCert, tlsKeyPEM
	files.TLSCACerts = [][]byte{s.hostCA.TLSCert}
	id, err := ParseIdentity(files)
	return id, trace.Wrap(err)
}

func (s *Server) signIdentityTLS(pub crypto.PublicKey, id, role string, dnsNames []string, ips []net.IP) ([]byte, error) {
	switch role {
	case RoleAuth, RoleNode, RoleProxy, RoleAdmin:
	default:
		return nil, trace.BadParameter("unknown identity role %q", role)
	}
	req := tlsCertRequest{
		publicKey: pub,
		id:        id,
		role:      role,
		cluster:   s.cfg.ClusterName,
	}
	if role == RoleAuth {
		req.server = true
		req.dnsNames = dnsNames
		req.ips = ips
	}
	cert, err := signTLSCert(s.tlsCACert, s.tlsCAKey, req, s.clock.Now())
	return cert, trace.Wrap(err)
}

// ensureAdminIdentity writes a fresh admin identity to dir unless a valid
// one for this cluster's current CA is already there, so pctl keeps
// working across restarts and a stale one (from a wiped backend) is
// replaced rather than failing every pctl call with a TLS error.
func (s *Server) ensureAdminIdentity(ctx context.Context, dir string) error {
	if id, err := ReadIdentity(dir); err == nil && s.identityValid(id) {
		return nil
	}
	id, err := s.IssueIdentity(ctx, IdentityRequest{ID: AdminIdentityID, Role: RoleAdmin})
	if err != nil {
		return trace.Wrap(err)
	}
	if err := WriteIdentity(dir, id); err != nil {
		return trace.Wrap(err, "writing the admin identity to %s", dir)
	}
	s.log.WithField("dir", dir).Info("Wrote the admin identity.")
	return nil
}

// identityValid reports whether id belongs to this cluster, chains to its
// current TLS CA and stays valid for at least a day.
func (s *Server) identityValid(id *Identity) bool {
	if id.ClusterName != s.cfg.ClusterName {
		return false
	}
	_, err := id.TLSLeaf.Verify(x509.VerifyOptions{
		Roots:       s.tlsCAPool(),
		CurrentTime: s.clock.Now().Add(24 * time.Hour),
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return err == nil
}
