package auth

import (
	"bytes"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/utils"
)

// The single-file identity format (`pctl --identity FILE`) is the identity
// directory's contents as one PEM stream, so one file can be copied to an
// operator's laptop: the first CERTIFICATE block is the TLS certificate,
// later ones are the TLS CAs; PRIVATE KEY (or EC PRIVATE KEY) is the TLS
// key; OPENSSH PRIVATE KEY is the SSH key; SSH CERTIFICATE holds the SSH
// certificate's authorized_keys line.
const pemTypeSSHCert = "SSH CERTIFICATE"

// MarshalIdentityFile encodes id in the single-file format.
func MarshalIdentityFile(id *Identity) []byte {
	var buf bytes.Buffer
	buf.Write(id.Files.TLSCert)
	buf.Write(id.Files.TLSKey)
	for _, ca := range id.Files.TLSCACerts {
		buf.Write(ca)
	}
	if len(id.Files.SSHKey) > 0 {
		buf.Write(id.Files.SSHKey)
		pem.Encode(&buf, &pem.Block{Type: pemTypeSSHCert, Bytes: id.Files.SSHCert})
	}
	return buf.Bytes()
}

// ParseIdentityFile decodes the single-file format.
func ParseIdentityFile(data []byte) (*Identity, error) {
	var f IdentityFiles
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		encoded := pem.EncodeToMemory(block)
		switch block.Type {
		case "CERTIFICATE":
			if f.TLSCert == nil {
				f.TLSCert = encoded
			} else {
				f.TLSCACerts = append(f.TLSCACerts, encoded)
			}
		case "PRIVATE KEY", "EC PRIVATE KEY":
			f.TLSKey = encoded
		case "OPENSSH PRIVATE KEY":
			f.SSHKey = encoded
		case pemTypeSSHCert:
			f.SSHCert = block.Bytes
		default:
			return nil, trace.BadParameter("unexpected PEM block %q in identity file", block.Type)
		}
	}
	switch {
	case f.TLSCert == nil:
		return nil, trace.BadParameter("identity file has no TLS certificate")
	case f.TLSKey == nil:
		return nil, trace.BadParameter("identity file has no TLS private key")
	case len(f.TLSCACerts) == 0:
		return nil, trace.BadParameter("identity file has no TLS CA certificate")
	}
	id, err := ParseIdentity(f)
	return id, trace.Wrap(err)
}

// WriteIdentityFile writes id to path (0600) in the single-file format.
func WriteIdentityFile(path string, id *Identity) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return trace.ConvertSystemError(err)
	}
	return trace.Wrap(utils.WriteFileAtomic(path, MarshalIdentityFile(id), 0o600))
}

// ReadIdentityFile reads a single-file identity; errors name the file.
func ReadIdentityFile(path string) (*Identity, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, trace.NotFound("identity file %s is missing", path)
	}
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	id, err := ParseIdentityFile(data)
	if err != nil {
		return nil, trace.BadParameter("identity file %s: %v", path, err)
	}
	return id, nil
}
