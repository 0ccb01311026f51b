package authz_test

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

func signHost(t *testing.T, ca ssh.Signer, key ssh.PublicKey, typ uint32, principals []string, after, before time.Time) *ssh.Certificate {
	t.Helper()
	cert := &ssh.Certificate{
		Key: key, Serial: 1, CertType: typ, KeyId: "node-1", ValidPrincipals: principals,
		ValidAfter: uint64(after.Unix()), ValidBefore: uint64(before.Unix()),
	}
	require.NoError(t, cert.SignCert(rand.Reader, ca))
	return cert
}

// TestHostKeyCallback: the one host-CA check of psh, the web terminal and
// the test clients accepts only a host certificate of a trusted CA, for
// the dialed name, inside its validity window on the injected clock.
func TestHostKeyCallback(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	now := clock.Now()
	ca, other := srvtest.NewSigner(t), srvtest.NewSigner(t)
	hostKey := srvtest.NewSigner(t).PublicKey()
	check := authz.HostKeyCallback([]ssh.PublicKey{other.PublicKey(), ca.PublicKey()}, clock)
	good := signHost(t, ca, hostKey, ssh.HostCert, []string{"node-1", "node-1.c1", "127.0.0.1"}, now.Add(-time.Minute), now.Add(time.Hour))

	require.NoError(t, check("node-1:22", nil, good))
	require.NoError(t, check("node-1.c1:3022", nil, good))
	require.NoError(t, check("127.0.0.1:3022", nil, good))
	require.NoError(t, check("node-1", nil, good), "an address without a port names the host")

	for name, c := range map[string]struct {
		addr string
		key  ssh.PublicKey
		want string
	}{
		"principal must match":                      {"node-2:22", good, `"node-2"`},
		"foreign CA":                                {"node-1:22", signHost(t, srvtest.NewSigner(t), hostKey, ssh.HostCert, []string{"node-1"}, now.Add(-time.Minute), now.Add(time.Hour)), "not signed by a trusted host CA"},
		"plain host keys are never trusted":         {"node-1:22", hostKey, "plain"},
		"a user certificate is no host certificate": {"node-1:22", signHost(t, ca, hostKey, ssh.UserCert, []string{"node-1"}, now.Add(-time.Minute), now.Add(time.Hour)), "user certificate"},
		"not yet valid":                             {"node-1:22", signHost(t, ca, hostKey, ssh.HostCert, []string{"node-1"}, now.Add(time.Minute), now.Add(time.Hour)), "not yet valid"},
	} {
		t.Run(name, func(t *testing.T) {
			err := check(c.addr, nil, c.key)
			require.ErrorContains(t, err, c.want)
		})
	}

	// Expiry follows the injected clock, not the wall clock.
	clock.Advance(2 * time.Hour)
	require.ErrorContains(t, check("node-1:22", nil, good), "expired")
	require.Error(t, authz.HostKeyCallback(nil, clock)("node-1:22", nil, good), "no CA trusts nothing")
}
