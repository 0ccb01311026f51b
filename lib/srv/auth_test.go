package srv

import (
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

func TestAuthDenials(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	e := newTestEnv(t, func(c *Config) { c.Clock = clock })
	me := e.me
	other := srvtest.NewCA(t)

	type tc struct {
		name   string
		login  string
		cert   srvtest.UserCert
		ca     *srvtest.CA
		setup  func()
		reason string
		// banner is what the client is told (a login refusal only);
		// empty: nothing, so that a client cannot probe which check
		// failed.
		banner string
	}
	cases := []tc{
		{
			name: "cert from another CA", login: me, ca: other,
			cert:   srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster},
			reason: `certificate is not signed by the user CA of cluster \"example\"`,
		},
		{
			name: "expired cert", login: me,
			cert:   srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster, Now: clock.Now().Add(-2 * time.Hour), TTL: time.Hour},
			reason: "certificate expired at 2026-11-30T11:00:00Z",
		},
		{
			name: "not yet valid", login: me,
			cert:   srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster, Now: clock.Now().Add(time.Hour)},
			reason: "certificate not valid before",
		},
		{
			name: "login not in principals", login: "nobody",
			cert:   srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster},
			reason: `principal \"nobody\" not in the set of valid principals`,
			banner: `postern: login "nobody" is not allowed by your roles (your logins: ` + me + `)`,
		},
		{
			// A forged or foreign certificate with a wrong login learns
			// nothing: its login is not the only fault.
			name: "login not in principals, cert from another CA", login: "nobody", ca: other,
			cert:   srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster},
			reason: `certificate is not signed by the user CA of cluster \"example\"`,
		},
		{
			name: "login not in principals, expired cert", login: "nobody",
			cert:   srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster, Now: clock.Now().Add(-2 * time.Hour), TTL: time.Hour},
			reason: `principal \"nobody\" not in the set of valid principals`,
		},
		{
			name: "login not granted by role", login: "nobody",
			// The principal is there, but the traits (what
			// {{internal.logins}} expands to) do not include it.
			cert: srvtest.UserCert{User: "alice", Logins: []string{"nobody"}, Cluster: testCluster,
				Traits: map[string][]string{services.TraitLogins: {me}}},
			reason: `as login \"nobody\" denied: no role grants that login on this node`,
			banner: `postern: login "nobody" is not allowed by your roles on this node (see ` + "`psh ls`" + `)`,
		},
		{
			name: "node labels not matched", login: me,
			cert: srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster},
			setup: func() {
				r := srvtest.AccessRole()
				r.Spec.NodeLabels = map[string]services.LabelValues{"env": {"prod"}}
				e.ap.UpsertRole(r)
			},
			reason: `access to node \"node1\" denied: no role matches its labels`,
			// Not a word about labels.
			banner: `postern: login "` + me + `" is not allowed by your roles on this node (see ` + "`psh ls`" + `)`,
		},
		{
			name: "unknown role", login: me,
			cert:   srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster, Roles: []string{"ghost"}},
			reason: "no role matches its labels",
			banner: `postern: login "` + me + `" is not allowed by your roles on this node (see ` + "`psh ls`" + `)`,
		},
		{
			name: "unknown critical option", login: me,
			cert: srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster,
				CriticalOptions: map[string]string{"force-command": "true"}},
			reason: `unsupported critical option \"force-command\"`,
		},
		{
			name: "cert from another cluster", login: me,
			cert:   srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: "elsewhere"},
			reason: `issued by cluster \"elsewhere\"`,
		},
		{
			name: "source-address enforced", login: me,
			cert: srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster,
				CriticalOptions: map[string]string{"source-address": "10.9.9.9/32"}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.ap.UpsertRole(srvtest.AccessRole())
			if c.setup != nil {
				c.setup()
			}
			ca := c.ca
			if ca == nil {
				ca = e.userCA
			}
			if c.cert.Now.IsZero() {
				c.cert.Now = clock.Now()
			}
			cfg := e.clientConfig(c.login, ca.UserSigner(t, c.cert))
			var mu sync.Mutex
			var banner string
			cfg.BannerCallback = func(msg string) error {
				mu.Lock()
				defer mu.Unlock()
				banner += msg
				return nil
			}
			client, err := ssh.Dial("tcp", e.addr, cfg)
			if err == nil {
				client.Close()
			}
			require.Error(t, err)
			require.Contains(t, err.Error(), "unable to authenticate")
			mu.Lock()
			got := banner
			mu.Unlock()
			if c.banner == "" {
				require.Empty(t, got)
			} else {
				require.Equal(t, c.banner+"\r\n", got)
				require.NotContains(t, got, "label")
			}
			if c.reason != "" {
				e.requireLog("Access denied.", c.reason)
			}
		})
	}

	// And the same connection with a good certificate works, and the fake
	// clock moving past its end makes new connections fail.
	e.ap.UpsertRole(srvtest.AccessRole())
	good := e.userCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{me}, Cluster: testCluster, Now: clock.Now(), TTL: time.Hour})
	client, err := e.dialAs(me, good)
	require.NoError(t, err)
	client.Close()
	clock.Advance(2 * time.Hour)
	_, err = e.dialAs(me, good)
	require.Error(t, err)
}

// TestPlainKeyRejected: only certificates are accepted.
func TestPlainKeyRejected(t *testing.T) {
	e := newTestEnv(t)
	_, err := e.dialAs(e.me, srvtest.NewSigner(t))
	require.Error(t, err)
}

// TestCredentialFor: a root node switches to the login; any other node
// only serves its own user and says so.
func TestCredentialFor(t *testing.T) {
	l := &Login{Name: "bob", UID: 1000, GID: 1000, Groups: []uint32{1000, 27}}
	cred, err := credentialForEUID(l, 0)
	require.NoError(t, err)
	require.Equal(t, &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{1000, 27}}, cred)

	cred, err = credentialForEUID(l, 1000)
	require.NoError(t, err)
	require.Nil(t, cred, "no identity switch for the node's own user")

	_, err = credentialForEUID(l, 0o4242)
	require.True(t, trace.IsAccessDenied(err))
	require.Contains(t, err.Error(), "not root: it can only start sessions as")
	require.Contains(t, err.Error(), `not as "bob"`)
}

// TestSessionRecheckAccess: RBAC is decided again for each new session,
// with the roles as they are now.
func TestSessionRecheckAccess(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	out, _, err := run(t, c, "echo ok")
	require.NoError(t, err)
	require.Equal(t, "ok\n", out)

	e.ap.DeleteRole("access")
	_, err = c.NewSession()
	var openErr *ssh.OpenChannelError
	require.ErrorAs(t, err, &openErr)
	require.Equal(t, ssh.Prohibited, openErr.Reason)
	e.requireLog("Session denied.", "no role matches its labels")

	e.ap.UpsertRole(srvtest.AccessRole())
	out, _, err = run(t, c, "echo back")
	require.NoError(t, err)
	require.Equal(t, "back\n", out)
}
