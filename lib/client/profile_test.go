package client

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCA signs user and host certificates for the tests.
type testCA struct {
	signer ssh.Signer
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	priv, _, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	s, err := ssh.ParsePrivateKey(priv)
	require.NoError(t, err)
	return &testCA{signer: s}
}

func (ca *testCA) sign(t *testing.T, pub ssh.PublicKey, typ uint32, principals []string, validBefore time.Time) *ssh.Certificate {
	t.Helper()
	cert := &ssh.Certificate{
		Key: pub, CertType: typ, KeyId: "alice", ValidPrincipals: principals,
		ValidAfter: uint64(time.Now().Add(-time.Minute).Unix()), ValidBefore: uint64(validBefore.Unix()),
		Permissions: ssh.Permissions{Extensions: map[string]string{services.CertExtensionRoles: `["access"]`}},
	}
	require.NoError(t, cert.SignCert(rand.Reader, ca.signer))
	return cert
}

func (ca *testCA) knownHosts() []string {
	return authapi.KnownHostsLines([]string{string(trimNL(ssh.MarshalAuthorizedKey(ca.signer.PublicKey())))})
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	return b
}

// newLogin makes a stored login whose certificate expires at exp.
func newLogin(t *testing.T, ca *testCA, exp time.Time) *StoredLogin {
	t.Helper()
	priv, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	pk, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	require.NoError(t, err)
	cert := ca.sign(t, pk, ssh.UserCert, []string{"alice", "root"}, exp)
	return &StoredLogin{
		Profile:    Profile{Proxy: "proxy.example.com:3080", ProxySSH: "proxy.example.com:3023", User: "alice", Cluster: "c1"},
		Key:        priv,
		Pub:        pub,
		Cert:       ssh.MarshalAuthorizedKey(cert),
		KnownHosts: ca.knownHosts(),
	}
}

func TestStoreSaveAndLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "home")
	st := NewStore(dir)
	ca := newTestCA(t)

	_, err := st.Credentials(time.Now())
	require.True(t, trace.IsNotFound(err), "%v", err)
	require.Contains(t, err.Error(), "psh login")

	l := newLogin(t, ca, time.Now().Add(time.Hour))
	require.NoError(t, st.Save(l))

	for _, d := range []string{dir, filepath.Join(dir, "keys"), filepath.Join(dir, "keys", "proxy.example.com:3080")} {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.Equal(t, dirMode, fi.Mode().Perm(), d)
	}
	p, err := st.Profile()
	require.NoError(t, err)
	require.Equal(t, l.Profile, *p)
	for _, f := range []string{st.KeyPath(p), st.KeyPath(p) + ".pub", st.CertPath(p), st.KnownHostsPath(), filepath.Join(dir, ProfileFile)} {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		require.Equal(t, fileMode, fi.Mode().Perm(), f)
	}
	entries, err := os.ReadDir(filepath.Dir(st.KeyPath(p)))
	require.NoError(t, err)
	require.Len(t, entries, 3, "no temporary files left behind")

	creds, err := st.Credentials(time.Now())
	require.NoError(t, err)
	require.Equal(t, "alice", creds.DefaultLogin())
	require.Len(t, creds.HostAuthorities, 1)
	s := StatusOf(creds)
	require.Equal(t, []string{"access"}, s.Roles)
	require.Equal(t, []string{"alice", "root"}, s.Logins)

	// Expired: one line telling the user to log in.
	_, err = st.Credentials(time.Now().Add(2 * time.Hour))
	require.ErrorContains(t, err, "expired")
	require.ErrorContains(t, err, "psh login")

	got, err := st.Logout()
	require.NoError(t, err)
	require.Equal(t, "alice", got.User)
	require.NoFileExists(t, st.KeyPath(p))
	require.NoFileExists(t, st.CertPath(p))
	require.NoFileExists(t, st.KnownHostsPath())
	_, err = st.Credentials(time.Now())
	require.True(t, trace.IsNotFound(err))
	_, err = st.Logout()
	require.True(t, trace.IsNotFound(err))
}

func TestStoreRejectsBadFiles(t *testing.T) {
	ca := newTestCA(t)
	setup := func(t *testing.T) (*Store, *Profile) {
		st := NewStore(t.TempDir())
		l := newLogin(t, ca, time.Now().Add(time.Hour))
		require.NoError(t, st.Save(l))
		return st, &l.Profile
	}

	t.Run("corrupted profile", func(t *testing.T) {
		st, _ := setup(t)
		require.NoError(t, os.WriteFile(filepath.Join(st.Dir, ProfileFile), []byte("{{{"), 0o600))
		_, err := st.Credentials(time.Now())
		require.ErrorContains(t, err, "is not a psh profile")
		// logout still cleans up a damaged profile.
		_, err = st.Logout()
		require.NoError(t, err)
		require.NoFileExists(t, filepath.Join(st.Dir, ProfileFile))
	})
	t.Run("foreign profile", func(t *testing.T) {
		st, _ := setup(t)
		require.NoError(t, os.WriteFile(filepath.Join(st.Dir, ProfileFile), []byte("proxy: a:1\nproxy_ssh: a:2\nuser: u\ncluster: c\ncolor: blue\n"), 0o600))
		_, err := st.Profile()
		require.ErrorContains(t, err, "field color not found")
		require.NoError(t, os.WriteFile(filepath.Join(st.Dir, ProfileFile), []byte("proxy: a:1\nproxy_ssh: a:2\nuser: ../../etc\ncluster: c\n"), 0o600))
		_, err = st.Profile()
		require.ErrorContains(t, err, "cannot be used as a file name")
	})
	t.Run("key with loose permissions", func(t *testing.T) {
		st, p := setup(t)
		require.NoError(t, os.Chmod(st.KeyPath(p), 0o644))
		_, err := st.Credentials(time.Now())
		require.True(t, trace.IsAccessDenied(err))
		require.ErrorContains(t, err, "chmod 600")
	})
	t.Run("damaged key", func(t *testing.T) {
		st, p := setup(t)
		require.NoError(t, os.WriteFile(st.KeyPath(p), []byte("garbage"), 0o600))
		_, err := st.Credentials(time.Now())
		require.ErrorContains(t, err, "is damaged")
	})
	t.Run("certificate of another key", func(t *testing.T) {
		st, p := setup(t)
		other := newLogin(t, ca, time.Now().Add(time.Hour))
		require.NoError(t, os.WriteFile(st.CertPath(p), other.Cert, 0o600))
		_, err := st.Credentials(time.Now())
		require.ErrorContains(t, err, "does not match")
	})
	t.Run("known_hosts without a CA", func(t *testing.T) {
		st, _ := setup(t)
		require.NoError(t, os.WriteFile(st.KnownHostsPath(), []byte("\n"), 0o600))
		_, err := st.Credentials(time.Now())
		require.ErrorContains(t, err, "holds no host CA")
	})
	t.Run("save refuses path tricks", func(t *testing.T) {
		st := NewStore(t.TempDir())
		l := newLogin(t, ca, time.Now().Add(time.Hour))
		l.Profile.Proxy = ".."
		require.Error(t, st.Save(l))
	})
}
