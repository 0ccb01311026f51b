package web

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// TestLiveSessionHostCAsAreOwnCluster: host_signers lists every
// cluster's host CA (the root's and each leaf's, for psh's known_hosts);
// the web session checks this cluster's nodes against this cluster's CA
// only, so a leaf's CA can never vouch for a root node in the terminal.
func TestLiveSessionHostCAsAreOwnCluster(t *testing.T) {
	key := func() (ssh.PublicKey, ssh.Signer) {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		s, err := ssh.NewSignerFromKey(priv)
		require.NoError(t, err)
		p, err := ssh.NewPublicKey(pub)
		require.NoError(t, err)
		return p, s
	}
	rootCA, rootSigner := key()
	leafCA, _ := key()
	userPub, userPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sshUser, err := ssh.NewPublicKey(userPub)
	require.NoError(t, err)
	cert := &ssh.Certificate{Key: sshUser, CertType: ssh.UserCert, KeyId: "alice", ValidPrincipals: []string{"ops"}, ValidBefore: ssh.CertTimeInfinity,
		Permissions: ssh.Permissions{Extensions: map[string]string{services.CertExtensionCluster: "root"}}}
	require.NoError(t, cert.SignCert(rand.Reader, rootSigner))
	live, err := newLiveSession(userPriv, &authapi.SSHLoginResponse{
		Username: "alice",
		Cert:     ssh.MarshalAuthorizedKey(cert),
		HostSigners: []authapi.HostSigner{
			{ClusterName: "root", CheckingKeys: []string{string(ssh.MarshalAuthorizedKey(rootCA))}},
			{ClusterName: "leaf", CheckingKeys: []string{string(ssh.MarshalAuthorizedKey(leafCA))}},
		},
	}, "root")
	require.NoError(t, err)
	require.Len(t, live.hostCAs, 1)
	require.Equal(t, rootCA.Marshal(), live.hostCAs[0].Key.Marshal())
}
