package web

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/authz"
)

func testSigner(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	s, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return s
}

// TestLiveSessionScopesLeafHostCAs: the web terminal checks this
// cluster's nodes with the login's host_signers of this cluster only; a
// certificate a leaf's CA signed is refused under a root node's UUID and
// under UUID.LEAF alike (a terminal to a leaf node checks that leaf's CA
// on its own path, leafHostKeys).
func TestLiveSessionScopesLeafHostCAs(t *testing.T) {
	rootCA, leafCA := testSigner(t), testSigner(t)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	sign := func(ca ssh.Signer, typ uint32, key ssh.PublicKey, principals ...string) *ssh.Certificate {
		c := &ssh.Certificate{Key: key, CertType: typ, KeyId: "k", ValidPrincipals: principals,
			ValidAfter: uint64(clock.Now().Add(-time.Minute).Unix()), ValidBefore: uint64(clock.Now().Add(time.Hour).Unix())}
		require.NoError(t, c.SignCert(rand.Reader, ca))
		return c
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sshPub, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	key := func(s ssh.Signer) string {
		b := ssh.MarshalAuthorizedKey(s.PublicKey())
		return string(b[:len(b)-1])
	}
	live, err := newLiveSession(priv, &authapi.SSHLoginResponse{
		Username: "alice",
		Cert:     ssh.MarshalAuthorizedKey(sign(rootCA, ssh.UserCert, sshPub, "alice")),
		HostSigners: []authapi.HostSigner{
			{ClusterName: "root", CheckingKeys: []string{key(rootCA)}},
			{ClusterName: "leaf", CheckingKeys: []string{key(leafCA)}},
		},
	}, "root")
	require.NoError(t, err)
	check := authz.ScopedHostKeyCallback(live.hostCAs, clock)
	hostKey := testSigner(t).PublicKey()
	const uuid = "5b0e2c1e-0000-4000-8000-000000000001"
	forged := sign(leafCA, ssh.HostCert, hostKey, uuid, uuid+".leaf")
	require.Error(t, check(uuid+":3022", nil, forged))
	require.Error(t, check(authz.ClusterHostName(uuid, "leaf", "root")+":3022", nil, forged))
	require.NoError(t, check(uuid+":3022", nil, sign(rootCA, ssh.HostCert, hostKey, uuid)))
}
