package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/utils"
)

// TestHostKeyFromFile: --host-key takes a plain public key; a private key
// or garbage is refused naming the file, before anything is dialed or
// registered.
func TestHostKeyFromFile(t *testing.T) {
	dir := t.TempDir()
	priv, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	c := &cli{stdin: strings.NewReader(""), stdout: &bytes.Buffer{}}
	got, err := c.hostKey(context.Background(), "127.0.0.1:1", openSSHFlags{hostKey: write("key.pub", pub)}, nil)
	require.NoError(t, err)
	require.Equal(t, string(pub), string(got))

	for name, data := range map[string][]byte{"key": priv, "junk.pub": []byte("hello\n")} {
		_, err := c.hostKey(context.Background(), "127.0.0.1:1", openSSHFlags{hostKey: write(name, data)}, nil)
		require.True(t, trace.IsBadParameter(err), "%v", err)
		require.Contains(t, err.Error(), "not a public key")
	}
	_, err = c.hostKey(context.Background(), "127.0.0.1:1", openSSHFlags{hostKey: filepath.Join(dir, "missing.pub")}, nil)
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), "--host-key")
}

// TestOpenSSHFiles: the three files, 0644, the snippet naming the other
// two by absolute path.
func TestOpenSSHFiles(t *testing.T) {
	dir, err := prepareOutDir(filepath.Join(t.TempDir(), "a", "b"))
	require.NoError(t, err)
	require.True(t, filepath.IsAbs(dir))
	require.NoError(t, writeOpenSSHFiles(dir, &authapi.OpenSSHNodeResponse{HostCert: []byte("cert\n"), UserCAKeys: []string{"ca1", "ca2"}}))
	for name, want := range map[string]string{
		openSSHHostCertFile: "cert\n",
		openSSHUserCAFile:   "ca1\nca2\n",
	} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Equal(t, want, string(data))
	}
	snippet, err := os.ReadFile(filepath.Join(dir, openSSHSnippetFile))
	require.NoError(t, err)
	var directives []string
	for _, l := range strings.Split(string(snippet), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			directives = append(directives, l)
		}
	}
	require.Equal(t, []string{
		"TrustedUserCAKeys " + filepath.Join(dir, openSSHUserCAFile),
		"HostCertificate " + filepath.Join(dir, openSSHHostCertFile),
		"AuthorizedPrincipalsFile none",
	}, directives)
	for _, f := range []string{openSSHHostCertFile, openSSHUserCAFile, openSSHSnippetFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o644), st.Mode().Perm(), f)
	}
}

// TestFetchHostKeyUnreachable: nothing listening is a connection problem
// naming the address, not a hang.
func TestFetchHostKeyUnreachable(t *testing.T) {
	_, err := fetchHostKey(context.Background(), "127.0.0.1:1", plainHostKeyAlgorithms)
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	require.Contains(t, err.Error(), "127.0.0.1:1")
}
