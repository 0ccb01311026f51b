package auth

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
)

func TestIdentityRoundTrip(t *testing.T) {
	env := newTestAuth(t)
	for _, role := range []string{RoleNode, RoleProxy, RoleAdmin} {
		t.Run(role, func(t *testing.T) {
			id := env.identity(t, "id-"+role, role)
			dir := filepath.Join(t.TempDir(), "identity")
			require.NoError(t, WriteIdentity(dir, id))

			st, err := os.Stat(dir)
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			wantFiles := 5
			if role == RoleAdmin {
				wantFiles = 3
			}
			require.Len(t, entries, wantFiles)
			for _, e := range entries {
				info, err := e.Info()
				require.NoError(t, err)
				require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), e.Name())
			}

			got, err := ReadIdentity(dir)
			require.NoError(t, err)
			require.Equal(t, id.ID, got.ID)
			require.Equal(t, role, got.Role)
			require.Equal(t, testCluster, got.ClusterName)
			require.Equal(t, id.Files, got.Files)
			if role == RoleAdmin {
				require.Nil(t, got.SSHSigner)
			} else {
				require.NotNil(t, got.SSHSigner)
				require.Equal(t, id.SSHCert.Marshal(), got.SSHCert.Marshal())
			}
			pin, err := CAPin(got.TLSCACertPEM())
			require.NoError(t, err)
			require.Equal(t, env.auth.CAPin(), pin)
		})
	}
}

func TestReadIdentityErrorsNameTheFile(t *testing.T) {
	env := newTestAuth(t)
	id := env.identity(t, "node-x", RoleNode)

	_, err := ReadIdentity(filepath.Join(t.TempDir(), "nothing"))
	requireKind(t, err, trace.IsNotFound, IdentityTLSCertFile)

	for _, name := range []string{IdentityTLSCertFile, IdentityTLSKeyFile, IdentityTLSCAFile, IdentitySSHKeyFile, IdentitySSHCertFile} {
		t.Run("missing "+name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, WriteIdentity(dir, id))
			require.NoError(t, os.Remove(filepath.Join(dir, name)))
			_, err := ReadIdentity(dir)
			requireKind(t, err, trace.IsNotFound, filepath.Join(dir, name))
		})
		t.Run("corrupt "+name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, WriteIdentity(dir, id))
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("garbage"), 0o600))
			_, err := ReadIdentity(dir)
			requireKind(t, err, trace.IsBadParameter, filepath.Join(dir, name))
		})
	}

	// Files that parse but do not belong together.
	other := env.identity(t, "node-y", RoleNode)
	dir := t.TempDir()
	require.NoError(t, WriteIdentity(dir, id))
	require.NoError(t, os.WriteFile(filepath.Join(dir, IdentitySSHKeyFile), other.Files.SSHKey, 0o600))
	_, err = ReadIdentity(dir)
	requireKind(t, err, trace.IsBadParameter, "does not match the SSH private key")
	require.NoError(t, WriteIdentity(dir, id))
	require.NoError(t, os.WriteFile(filepath.Join(dir, IdentityTLSKeyFile), other.Files.TLSKey, 0o600))
	_, err = ReadIdentity(dir)
	requireKind(t, err, trace.IsBadParameter, "TLS key does not match")
	// A certificate from another cluster's CA.
	foreign := newTestAuth(t)
	require.NoError(t, WriteIdentity(dir, id))
	require.NoError(t, os.WriteFile(filepath.Join(dir, IdentityTLSCAFile), foreign.auth.TLSCACertPEM(), 0o600))
	_, err = ReadIdentity(dir)
	requireKind(t, err, trace.IsBadParameter, "not signed by the identity's CA")
}

func TestAdminIdentityReplacedWhenStale(t *testing.T) {
	env := newTestAuth(t)
	// An admin identity from another cluster's CA (a wiped backend, say)
	// is replaced on start.
	other := newTestAuth(t)
	require.NoError(t, os.RemoveAll(env.adminDir))
	stale, err := ReadIdentity(other.adminDir)
	require.NoError(t, err)
	require.NoError(t, WriteIdentity(env.adminDir, stale))
	require.NoError(t, env.auth.ensureAdminIdentity(t.Context(), env.adminDir))
	fresh, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	require.NotEqual(t, stale.Files.TLSCert, fresh.Files.TLSCert)
	require.True(t, env.auth.identityValid(fresh))
}

func TestIdentityFile(t *testing.T) {
	env := newTestAuth(t)
	for _, role := range []string{RoleNode, RoleAdmin} {
		id := env.identity(t, "f-"+role, role)
		path := filepath.Join(t.TempDir(), "sub", "identity.pem")
		require.NoError(t, WriteIdentityFile(path, id))
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
		got, err := ReadIdentityFile(path)
		require.NoError(t, err)
		require.Equal(t, id.ID, got.ID)
		require.Equal(t, role, got.Role)
		require.Equal(t, id.Files, got.Files)
	}
	_, err := ReadIdentityFile(filepath.Join(t.TempDir(), "none.pem"))
	requireKind(t, err, trace.IsNotFound, "none.pem")
	bad := filepath.Join(t.TempDir(), "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o600))
	_, err = ReadIdentityFile(bad)
	requireKind(t, err, trace.IsBadParameter, "bad.pem")
}
