package client

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/utils"
)

// TestSessionCertPath: the file a per-session certificate goes to is
// named by what OpenSSH passes, and nothing in it can leave the store's
// directory.
func TestSessionCertPath(t *testing.T) {
	s := NewStore("/home/a/.postern")
	p, err := s.SessionCertPath("root", "db.c1", "22")
	require.NoError(t, err)
	require.Equal(t, "/home/a/.postern/session-mfa/root@db.c1:22-cert.pub", p)
	for _, bad := range [][3]string{{"root", "../../etc/x", "22"}, {"root", "..", "22"}, {"a/b", "db", "22"}, {"root", "db", ""}, {"", "db", "22"}} {
		_, err := s.SessionCertPath(bad[0], bad[1], bad[2])
		require.Error(t, err, "%q", bad)
	}
}

// TestSessionCertCredentials: psh proxy ssh takes a waiting per-session
// certificate only if it certifies the login's own key and is valid now;
// anything else leaves the login's certificate in place.
func TestSessionCertCredentials(t *testing.T) {
	ca := newTestCA(t)
	st := NewStore(t.TempDir())
	require.NoError(t, st.Save(newLogin(t, ca, time.Now().Add(time.Hour))))
	creds, err := st.Credentials(time.Now())
	require.NoError(t, err)
	path, err := st.SessionCertPath("root", "db.c1", "22")
	require.NoError(t, err)

	got, ok, err := SessionCertCredentials(creds, path, time.Now())
	require.NoError(t, err)
	require.False(t, ok, "no file: the login's certificate")
	require.Same(t, creds, got)

	sess := ca.sign(t, creds.Cert.Key, ssh.UserCert, []string{"root"}, time.Now().Add(time.Minute))
	sessCreds := *creds
	sessCreds.Cert = sess
	require.NoError(t, WriteSessionCert(path, &sessCreds))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	got, ok, err = SessionCertCredentials(creds, path, time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, sess.Marshal(), got.Cert.Marshal())
	require.Equal(t, sess.Marshal(), got.Signer.PublicKey().Marshal())

	// A minute later it is spent.
	_, ok, err = SessionCertCredentials(creds, path, time.Now().Add(2*time.Minute))
	require.NoError(t, err)
	require.False(t, ok)

	// A certificate for another key (planted, or an older login's) is
	// not taken.
	_, otherPub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	pk, _, _, _, err := ssh.ParseAuthorizedKey(otherPub)
	require.NoError(t, err)
	other := *creds
	other.Cert = ca.sign(t, pk, ssh.UserCert, []string{"root"}, time.Now().Add(time.Minute))
	require.NoError(t, os.WriteFile(path, ssh.MarshalAuthorizedKey(other.Cert), 0o600))
	got, ok, err = SessionCertCredentials(creds, path, time.Now())
	require.NoError(t, err)
	require.False(t, ok)
	require.Same(t, creds, got)

	// Garbage is ignored too.
	require.NoError(t, os.WriteFile(path, []byte("not a certificate"), 0o600))
	_, ok, err = SessionCertCredentials(creds, path, time.Now())
	require.NoError(t, err)
	require.False(t, ok)
	require.Empty(t, mustGlob(t, filepath.Join(filepath.Dir(path), ".session-cert-*")), "no temporary file left")
}

func mustGlob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	require.NoError(t, err)
	return m
}

// TestSessionMFAMatchQuoting: a psh or store path that OpenSSH's Match
// exec could not run as written (a quote, a % token) gets no Match block
// rather than a command the shell would read otherwise.
func TestSessionMFAMatchQuoting(t *testing.T) {
	p := &Profile{Proxy: "proxy.example:3080", ProxySSH: "proxy.example:3023", User: "alice", Cluster: "c1"}
	out, err := NewStore("/home/a/.postern").OpenSSHConfig(p, "/usr/bin/psh")
	require.NoError(t, err)
	require.Contains(t, out, "Match host \"*.c1,!proxy.example\" exec \"'/usr/bin/psh' --home='/home/a/.postern' proxy ssh --cluster=c1 --session-mfa %r@%h:%p\"\n")
	for _, home := range []string{"/home/o'brien/.postern", "/home/a/%d", "/home/\"q\""} {
		out, err := NewStore(home).OpenSSHConfig(p, "/usr/bin/psh")
		require.NoError(t, err)
		require.NotContains(t, out, "Match ", home)
	}
	out, err = NewStore("/home/a/.postern").OpenSSHConfig(p, "/opt/it's/psh")
	require.NoError(t, err)
	require.NotContains(t, out, "Match ")
}
