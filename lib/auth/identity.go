package auth

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/utils"
)

// Identity is what a process presents to the rest of the cluster: an X.509
// certificate for the auth API (whose subject encodes ID, role and cluster)
// and, for nodes, proxies and auth, an SSH host key with its certificate.
// The admin identity has no SSH part.
type Identity struct {
	// ID is the host UUID for nodes and proxies, AuthIdentityID or
	// AdminIdentityID for the auth server's own identities.
	ID string
	// Role is one of RoleAuth, RoleNode, RoleProxy, RoleAdmin.
	Role string
	// ClusterName is the cluster that issued the identity.
	ClusterName string
	// Files are the raw contents, as written on disk.
	Files IdentityFiles

	// Parsed forms of Files.

	// SSHSigner signs with the SSH key and presents the certificate; nil
	// for the admin identity.
	SSHSigner ssh.Signer
	// SSHCert is the SSH certificate; nil for the admin identity.
	SSHCert *ssh.Certificate
	// TLSCert is the client certificate with its key.
	TLSCert tls.Certificate
	// TLSLeaf is the parsed TLS certificate.
	TLSLeaf *x509.Certificate
	// TLSCAPool holds the cluster's TLS CA certificates.
	TLSCAPool *x509.CertPool
}

// IdentityFiles are an identity's PEM and authorized_keys blobs.
type IdentityFiles struct {
	// SSHKey is the OpenSSH PEM private key; empty for admin.
	SSHKey []byte
	// SSHCert is the SSH certificate, authorized_keys format; empty for admin.
	SSHCert []byte
	// TLSCert and TLSKey are PEM.
	TLSCert []byte
	TLSKey  []byte
	// TLSCACerts are the cluster's TLS CA certificates, PEM, one per entry.
	TLSCACerts [][]byte
}

// Identity file names inside an identity directory.
const (
	IdentitySSHKeyFile  = "ssh.key"
	IdentitySSHCertFile = "ssh-cert.pub"
	IdentityTLSCertFile = "tls.crt"
	IdentityTLSKeyFile  = "tls.key"
	IdentityTLSCAFile   = "tls-ca.crt"
)

// ParseIdentity parses and cross-checks identity files: the TLS certificate
// must chain to one of the CAs and match its key, and the SSH certificate
// must match the SSH key.
func ParseIdentity(f IdentityFiles) (*Identity, error) {
	leaf, err := parseCertPEM(f.TLSCert)
	if err != nil {
		return nil, trace.BadParameter("TLS certificate: %v", err)
	}
	if len(leaf.Subject.Organization) != 1 || len(leaf.Subject.OrganizationalUnit) != 1 || leaf.Subject.CommonName == "" {
		return nil, trace.BadParameter("TLS certificate %q is not a Postern identity (want CN=id, O=role, OU=cluster)", leaf.Subject)
	}
	id := &Identity{
		ID:          leaf.Subject.CommonName,
		Role:        leaf.Subject.Organization[0],
		ClusterName: leaf.Subject.OrganizationalUnit[0],
		Files:       f,
		TLSLeaf:     leaf,
		TLSCAPool:   x509.NewCertPool(),
	}
	id.TLSCert, err = tls.X509KeyPair(f.TLSCert, f.TLSKey)
	if err != nil {
		return nil, trace.BadParameter("TLS key does not match the TLS certificate or is corrupt: %v", err)
	}
	id.TLSCert.Leaf = leaf
	if len(f.TLSCACerts) == 0 {
		return nil, trace.BadParameter("missing TLS CA certificates")
	}
	for _, caPEM := range f.TLSCACerts {
		ca, err := parseCertPEM(caPEM)
		if err != nil {
			return nil, trace.BadParameter("TLS CA certificate: %v", err)
		}
		id.TLSCAPool.AddCert(ca)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:       id.TLSCAPool,
		CurrentTime: leaf.NotBefore.Add(clockSkew), // chain check only; expiry is the peer's call
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, trace.BadParameter("TLS certificate is not signed by the identity's CA: %v", err)
	}
	switch id.Role {
	case RoleAuth, RoleNode, RoleProxy, RoleAdmin:
	default:
		return nil, trace.BadParameter("TLS certificate has unknown role %q", id.Role)
	}
	if len(f.SSHKey) == 0 && len(f.SSHCert) == 0 {
		if id.Role != RoleAdmin {
			return nil, trace.BadParameter("identity of role %q has no SSH key and certificate", id.Role)
		}
		return id, nil
	}
	signer, err := ssh.ParsePrivateKey(f.SSHKey)
	if err != nil {
		return nil, trace.BadParameter("SSH private key is corrupt: %v", err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(f.SSHCert)
	if err != nil {
		return nil, trace.BadParameter("SSH certificate is corrupt: %v", err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, trace.BadParameter("SSH certificate file holds a plain key, not a certificate")
	}
	if !bytes.Equal(cert.Key.Marshal(), signer.PublicKey().Marshal()) {
		return nil, trace.BadParameter("SSH certificate does not match the SSH private key")
	}
	id.SSHSigner, err = ssh.NewCertSigner(cert, signer)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	id.SSHCert = cert
	return id, nil
}

// TLSCACertPEM returns the first TLS CA certificate (the one to pin).
func (i *Identity) TLSCACertPEM() []byte {
	if len(i.Files.TLSCACerts) == 0 {
		return nil
	}
	return i.Files.TLSCACerts[0]
}

// ClientTLSConfig is a TLS config for calling the auth API with this
// identity: it presents the identity's certificate and trusts only the
// cluster CA, expecting the auth server's fixed name AuthServerName.
func (i *Identity) ClientTLSConfig() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{i.TLSCert},
		RootCAs:      i.TLSCAPool,
		ServerName:   AuthServerName,
		MinVersion:   tls.VersionTLS12,
	}
}

// WriteIdentity writes id's files into dir (created 0700; files 0600).
// Each file is written to a temporary name and renamed, so a crash never
// leaves a half-written key behind.
func WriteIdentity(dir string, id *Identity) error {
	if id == nil {
		return trace.BadParameter("missing identity")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return trace.ConvertSystemError(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return trace.ConvertSystemError(err)
	}
	files := map[string][]byte{
		IdentityTLSCertFile: id.Files.TLSCert,
		IdentityTLSKeyFile:  id.Files.TLSKey,
		IdentityTLSCAFile:   bytes.Join(id.Files.TLSCACerts, nil),
	}
	if len(id.Files.SSHKey) > 0 {
		files[IdentitySSHKeyFile] = id.Files.SSHKey
		files[IdentitySSHCertFile] = id.Files.SSHCert
	}
	for name, data := range files {
		if err := utils.WriteFileAtomic(filepath.Join(dir, name), data, 0o600); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// ReadIdentity reads an identity written by WriteIdentity. A missing
// directory or TLS file is NotFound (first start: join); anything corrupt
// is BadParameter naming the file.
func ReadIdentity(dir string) (*Identity, error) {
	read := func(name string, required bool) ([]byte, error) {
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			if !required {
				return nil, nil
			}
			return nil, trace.NotFound("identity file %s is missing", path)
		}
		if err != nil {
			return nil, trace.ConvertSystemError(err)
		}
		return data, nil
	}
	var f IdentityFiles
	var err error
	if f.TLSCert, err = read(IdentityTLSCertFile, true); err != nil {
		return nil, trace.Wrap(err)
	}
	if f.TLSKey, err = read(IdentityTLSKeyFile, true); err != nil {
		return nil, trace.Wrap(err)
	}
	caData, err := read(IdentityTLSCAFile, true)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if f.SSHKey, err = read(IdentitySSHKeyFile, false); err != nil {
		return nil, trace.Wrap(err)
	}
	if f.SSHCert, err = read(IdentitySSHCertFile, false); err != nil {
		return nil, trace.Wrap(err)
	}
	// Name the culprit file rather than failing inside ParseIdentity with a
	// message that does not say where the bad bytes came from.
	if _, err := parseCertPEM(f.TLSCert); err != nil {
		return nil, trace.BadParameter("identity file %s: %v", filepath.Join(dir, IdentityTLSCertFile), err)
	}
	if _, err := parseTLSPrivateKey(f.TLSKey); err != nil {
		return nil, trace.BadParameter("identity file %s: %v", filepath.Join(dir, IdentityTLSKeyFile), err)
	}
	cas, err := parseCertsPEM(caData)
	if err != nil {
		return nil, trace.BadParameter("identity file %s: %v", filepath.Join(dir, IdentityTLSCAFile), err)
	}
	for _, ca := range cas {
		f.TLSCACerts = append(f.TLSCACerts, pemCert(ca.Raw))
	}
	if (len(f.SSHKey) == 0) != (len(f.SSHCert) == 0) {
		missing := IdentitySSHKeyFile
		if len(f.SSHCert) == 0 {
			missing = IdentitySSHCertFile
		}
		return nil, trace.NotFound("identity file %s is missing", filepath.Join(dir, missing))
	}
	if len(f.SSHKey) > 0 {
		if _, err := ssh.ParsePrivateKey(f.SSHKey); err != nil {
			return nil, trace.BadParameter("identity file %s: corrupt SSH private key: %v", filepath.Join(dir, IdentitySSHKeyFile), err)
		}
		if _, _, _, _, err := ssh.ParseAuthorizedKey(f.SSHCert); err != nil {
			return nil, trace.BadParameter("identity file %s: corrupt SSH certificate: %v", filepath.Join(dir, IdentitySSHCertFile), err)
		}
	}
	id, err := ParseIdentity(f)
	if err != nil {
		return nil, trace.BadParameter("identity in %s: %v", dir, err)
	}
	return id, nil
}
