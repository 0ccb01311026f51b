package auth

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
	"github.com/postern-dev/postern/lib/utils"
)

// TestOpenSSHNodeEnforcesUserCerts: an OpenSSH node trusts the user CA
// and nothing else of Postern, so what the certificate says is all it
// enforces. Against Debian's sshd (TrustedUserCAKeys,
// AuthorizedPrincipalsFile none): the logins the roles allow log in, a
// login they do not allow is refused by sshd itself on a direct
// connection, Postern's own extensions are ignored, and -L works only
// when a role allows port forwarding.
func TestOpenSSHNodeEnforcesUserCerts(t *testing.T) {
	env := newTestAuth(t)
	ctx := context.Background()
	hostCA := srvtest.NewCA(t)
	d := srvtest.StartSSHD(t, srvtest.SSHDConfig{HostCA: hostCA, HostPrincipals: []string{"db1", "127.0.0.1"}, UserCAKeys: env.auth.UserCAKeys()})

	require.NoError(t, env.store.UpsertRole(ctx, &services.Role{
		Metadata: services.Metadata{Name: "root-nofwd"},
		Spec:     services.RoleSpec{Logins: []string{"root"}, NodeLabels: map[string]services.LabelValues{"*": {"*"}}},
	}))
	for _, u := range []struct {
		name   string
		logins []string
		roles  []string
	}{
		{"alice", []string{"root"}, []string{services.PresetAccessRole}},
		{"bob", []string{"deploy"}, []string{services.PresetAccessRole}},
		{"carol", nil, []string{"root-nofwd"}},
	} {
		_, err := env.auth.CreateUser(ctx, u.name, []byte("secret-pw"), u.logins, u.roles, false)
		require.NoError(t, err)
	}
	login := func(user, as string) (*ssh.Client, error) {
		priv, pub, err := utils.GenerateKeyPair()
		require.NoError(t, err)
		certBytes, err := env.auth.GenerateUserCert(ctx, authapi.UserCertRequest{User: user, PublicKey: pub, TTL: time.Hour})
		require.NoError(t, err)
		signer, err := ssh.ParsePrivateKey(priv)
		require.NoError(t, err)
		certSigner, err := ssh.NewCertSigner(parseSSHCert(t, certBytes), signer)
		require.NoError(t, err)
		return ssh.Dial("tcp", d.Addr, &ssh.ClientConfig{
			User:            as,
			Auth:            []ssh.AuthMethod{ssh.PublicKeys(certSigner)},
			HostKeyCallback: hostCA.HostKeyCallback(),
			Timeout:         10 * time.Second,
		})
	}

	// A login the roles allow (and the postern-* extensions sshd does
	// not know): authenticated. (No command is run: root's shell start-up
	// on this machine is slow and tells nothing about the certificate.)
	c, err := login("alice", "root")
	require.NoError(t, err)
	// -L: the access role allows port forwarding. The target is sshd's
	// own port, whatever answers there is enough.
	fwd, err := c.Dial("tcp", d.Addr)
	require.NoError(t, err)
	fwd.Close()
	c.Close()

	// A login the roles do not allow: refused by sshd, not by a proxy.
	_, err = login("bob", "root")
	require.ErrorContains(t, err, "unable to authenticate")

	// A role without port forwarding: the certificate has no
	// permit-port-forwarding, and sshd refuses -L.
	c, err = login("carol", "root")
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Dial("tcp", d.Addr)
	var open *ssh.OpenChannelError
	require.ErrorAs(t, err, &open)
	require.Equal(t, ssh.Prohibited, open.Reason)
}
