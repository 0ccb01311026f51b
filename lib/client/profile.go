// Package client is psh's engine: the profile and key store under
// $POSTERN_HOME, login against the proxy's web API, and SSH to nodes
// through the proxy's `proxy:` subsystem with the certificate login
// fetched.
package client

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"
	"gopkg.in/yaml.v3"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// HomeEnv overrides the home directory (default ~/.postern).
const HomeEnv = "POSTERN_HOME"

// File names inside the home directory (docs/reference.md, psh).
const (
	ProfileFile    = "profile.yaml"
	KnownHostsFile = "known_hosts"
	keysDir        = "keys"
)

// Permissions: keys and profile are the user's secrets and nobody else's
// business; OpenSSH refuses a private key others can read, and so do we.
const (
	dirMode  os.FileMode = 0o700
	fileMode os.FileMode = 0o600
)

// loginHint ends every "you have no usable credentials" message.
const loginHint = "run `psh login --proxy HOST:PORT --user NAME`"

// Profile is profile.yaml: who is logged in where.
type Profile struct {
	// Proxy is the proxy's web address HOST:PORT (login, ping).
	Proxy string `yaml:"proxy"`
	// ProxySSH is the proxy's SSH address HOST:PORT (ssh, ls).
	ProxySSH string `yaml:"proxy_ssh"`
	// User is the Postern user.
	User string `yaml:"user"`
	// Cluster is the proxy's cluster.
	Cluster string `yaml:"cluster"`
	// Clusters are the leaf clusters whose host CAs the login received
	// (sorted): `psh config` writes a block for each. Empty for a login
	// to a cluster without leaves, and for profiles written before leaves.
	Clusters []string `yaml:"clusters,omitempty"`
}

func (p *Profile) check() error {
	for name, v := range map[string]string{"proxy": p.Proxy, "proxy_ssh": p.ProxySSH, "user": p.User, "cluster": p.Cluster} {
		if v == "" {
			return trace.BadParameter("missing %q", name)
		}
	}
	if err := safePathElem(p.Proxy); err != nil {
		return trace.BadParameter("proxy: %v", err)
	}
	if err := safePathElem(p.User); err != nil {
		return trace.BadParameter("user: %v", err)
	}
	// Cluster names go into known_hosts patterns and an OpenSSH config:
	// only the names Postern itself accepts, so nothing can add a pattern
	// or a config keyword.
	for _, c := range append([]string{p.Cluster}, p.Clusters...) {
		if err := services.CheckClusterName(c); err != nil {
			return trace.BadParameter("cluster %q: %v", c, err)
		}
	}
	return nil
}

// safePathElem checks a value used as a directory or file name under
// keys/: a proxy address or user name must not walk out of it.
func safePathElem(s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\\\x00") {
		return trace.BadParameter("%q cannot be used as a file name", s)
	}
	return nil
}

// Store is the home directory.
type Store struct {
	// Dir is the home directory.
	Dir string
}

// DefaultHome is $POSTERN_HOME, or ~/.postern.
func DefaultHome() (string, error) {
	if d := os.Getenv(HomeEnv); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", trace.BadParameter("cannot find the home directory (%v): set %s", err, HomeEnv)
	}
	return filepath.Join(home, ".postern"), nil
}

// NewStore returns the store at dir.
func NewStore(dir string) *Store { return &Store{Dir: dir} }

// KeyPath is keys/PROXY/USER; the public key and certificate sit next to
// it as USER.pub and USER-cert.pub (the names OpenSSH looks for).
func (s *Store) KeyPath(p *Profile) string {
	return filepath.Join(s.Dir, keysDir, p.Proxy, p.User)
}

// CertPath is the certificate next to KeyPath.
func (s *Store) CertPath(p *Profile) string { return s.KeyPath(p) + "-cert.pub" }

// KnownHostsPath is the known_hosts file with the host CA lines.
func (s *Store) KnownHostsPath() string { return filepath.Join(s.Dir, KnownHostsFile) }

func (s *Store) profilePath() string { return filepath.Join(s.Dir, ProfileFile) }

// StoredLogin is what a successful login stores.
type StoredLogin struct {
	Profile Profile
	// Key is the private key (OpenSSH PEM), Pub its public half and Cert
	// the certificate (both authorized_keys format).
	Key, Pub, Cert []byte
	// KnownHosts are "@cert-authority * KEY" lines for the local cluster's
	// host CA and "@cert-authority *.LEAF KEY" for each leaf's.
	KnownHosts []string
}

// Save writes a login. Every file is written to a temporary name and
// renamed, so a login that fails midway never leaves a truncated key, and
// the profile is written last: until it names the new files, the previous
// login (if any) stays the current one.
func (s *Store) Save(l *StoredLogin) error {
	if err := l.Profile.check(); err != nil {
		return trace.Wrap(err)
	}
	keyPath := s.KeyPath(&l.Profile)
	if err := os.MkdirAll(filepath.Dir(keyPath), dirMode); err != nil {
		return trace.ConvertSystemError(err)
	}
	// MkdirAll leaves existing directories alone; make sure the ones we
	// own are private.
	for _, d := range []string{s.Dir, filepath.Join(s.Dir, keysDir), filepath.Dir(keyPath)} {
		if err := os.Chmod(d, dirMode); err != nil {
			return trace.ConvertSystemError(err)
		}
	}
	profile, err := yaml.Marshal(&l.Profile)
	if err != nil {
		return trace.Wrap(err)
	}
	known := strings.Join(l.KnownHosts, "\n") + "\n"
	files := []struct {
		path string
		data []byte
	}{
		{keyPath, l.Key},
		{keyPath + ".pub", l.Pub},
		{s.CertPath(&l.Profile), l.Cert},
		{s.KnownHostsPath(), []byte(known)},
		{s.profilePath(), profile},
	}
	for _, f := range files {
		if err := utils.WriteFileAtomic(f.path, f.data, fileMode); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// Profile reads profile.yaml. No profile: NotFound telling the user to
// log in; a profile that is not ours or is damaged: BadParameter naming
// the file.
func (s *Store) Profile() (*Profile, error) {
	path := s.profilePath()
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, trace.NotFound("not logged in: %s", loginHint)
	}
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var p Profile
	if err := dec.Decode(&p); err != nil {
		return nil, trace.BadParameter("profile %s is not a psh profile (%v): remove it and %s", path, oneLine(err), loginHint)
	}
	if err := p.check(); err != nil {
		return nil, trace.BadParameter("profile %s is not a psh profile (%v): remove it and %s", path, oneLine(err), loginHint)
	}
	return &p, nil
}

// Credentials are the loaded key, certificate and host CA check.
type Credentials struct {
	Profile *Profile
	// Signer signs with the certificate.
	Signer ssh.Signer
	Cert   *ssh.Certificate
	// KeyPEM is the private key file's content (for the agent).
	KeyPEM []byte
	// HostKeyCallback checks hosts against the host CA lines only, each
	// CA for the names its line's patterns allow.
	HostKeyCallback ssh.HostKeyCallback
	// HostAuthorities are the host CA lines of known_hosts.
	HostAuthorities []authz.HostAuthority
}

// HostKeyName is the name target's host certificate is checked under:
// HOST.LEAF for a leaf's node (only that name is vouched for by the
// leaf's host CA), the host itself in the proxy's cluster.
func (c *Credentials) HostKeyName(target proxy.Target) string {
	return authz.ClusterHostName(target.Host, target.Cluster, c.Profile.Cluster)
}

// Expires is when the certificate stops being valid.
func (c *Credentials) Expires() time.Time { return time.Unix(int64(c.Cert.ValidBefore), 0) }

// Credentials loads the current profile's key and certificate and refuses
// what would fail later with a worse message: a key others can read, a
// damaged file, an expired certificate.
func (s *Store) Credentials(now time.Time) (*Credentials, error) {
	p, err := s.Profile()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	keyPath := s.KeyPath(p)
	keyPEM, err := readPrivateFile(keyPath)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	key, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, trace.BadParameter("key %s is damaged (%v): %s", keyPath, oneLine(err), loginHint)
	}
	certPath := s.CertPath(p)
	certData, err := os.ReadFile(certPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, trace.NotFound("no certificate at %s: %s", certPath, loginHint)
	}
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(certData)
	cert, ok := pub.(*ssh.Certificate)
	if err != nil || !ok {
		return nil, trace.BadParameter("certificate %s is damaged: %s", certPath, loginHint)
	}
	if !bytes.Equal(cert.Key.Marshal(), key.PublicKey().Marshal()) {
		return nil, trace.BadParameter("certificate %s does not match key %s: %s", certPath, keyPath, loginHint)
	}
	if exp := time.Unix(int64(cert.ValidBefore), 0); !now.Before(exp) {
		return nil, trace.AccessDenied("credentials for %s at %s expired at %s: %s", p.User, p.Proxy, exp.Format(time.RFC3339), loginHint)
	}
	signer, err := ssh.NewCertSigner(cert, key)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	auths, err := readHostCAs(s.KnownHostsPath())
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &Credentials{Profile: p, Signer: signer, Cert: cert, KeyPEM: keyPEM, HostAuthorities: auths, HostKeyCallback: authz.ScopedHostKeyCallback(auths, nil)}, nil
}

// readPrivateFile reads a private key after checking that only its owner
// can read it, as OpenSSH does ("UNPROTECTED PRIVATE KEY FILE").
func readPrivateFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, trace.NotFound("no key at %s: %s", path, loginHint)
	}
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, trace.AccessDenied("key %s is accessible by others (mode %#o): run `chmod 600 %s`, or %s", path, perm, path, loginHint)
	}
	data, err := os.ReadFile(path)
	return data, trace.ConvertSystemError(err)
}

// readHostCAs reads the "@cert-authority PATTERNS KEY" lines psh wrote,
// each CA with the host patterns it vouches for.
func readHostCAs(path string) ([]authz.HostAuthority, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, trace.NotFound("no %s in %s: %s", KnownHostsFile, filepath.Dir(path), loginHint)
	}
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	var cas []authz.HostAuthority
	for rest := data; len(bytes.TrimSpace(rest)) > 0; {
		marker, hosts, key, _, next, err := ssh.ParseKnownHosts(rest)
		if err != nil {
			return nil, trace.BadParameter("%s is damaged (%v): %s", path, oneLine(err), loginHint)
		}
		if marker == "cert-authority" {
			cas = append(cas, authz.HostAuthority{Key: key, Patterns: hosts})
		}
		rest = next
	}
	if len(cas) == 0 {
		return nil, trace.BadParameter("%s holds no host CA: %s", path, loginHint)
	}
	return cas, nil
}

// Logout removes the current profile's key, public key, certificate,
// known_hosts and the profile itself. It reports NotFound when nobody is
// logged in.
func (s *Store) Logout() (*Profile, error) {
	p, err := s.Profile()
	if err != nil && !trace.IsBadParameter(err) {
		return nil, trace.Wrap(err)
	}
	var paths []string
	if p != nil {
		paths = append(paths, s.KeyPath(p), s.KeyPath(p)+".pub", s.CertPath(p))
	}
	paths = append(paths, s.KnownHostsPath(), s.profilePath())
	for _, path := range paths {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, trace.ConvertSystemError(err)
		}
	}
	if p != nil {
		_ = os.Remove(filepath.Dir(s.KeyPath(p))) // only when empty
	}
	return p, nil
}

// oneLine squeezes a parser's error onto one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(fmt.Sprint(err)), " ")
}
