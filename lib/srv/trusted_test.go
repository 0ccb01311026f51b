package srv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// rootCluster is the name of the root cluster in these tests; the node is
// in testCluster, a leaf of it.
const rootCluster = "root"

// trustRoot makes e's cluster a leaf of a root whose user CA is returned:
// the root's user CA is stored as the leaf's auth server stores it, and a
// trusted_cluster maps the root's "access" to the leaf's "dev", which
// reaches only env=test nodes.
func trustRoot(t *testing.T, e *testEnv) *srvtest.CA {
	rootCA := srvtest.NewCA(t)
	e.ap.SetCA(rootCA.CertAuthority(rootCluster, services.UserCA))
	e.ap.UpsertTrustedCluster(&services.TrustedCluster{
		Metadata: services.Metadata{Name: rootCluster},
		Spec: services.TrustedClusterSpec{Enabled: true, RoleMap: services.RoleMap{
			{Remote: "access", Local: []string{"dev"}},
		}},
	})
	dev := srvtest.AccessRole()
	dev.Metadata.Name = "dev"
	dev.Spec.NodeLabels = map[string]services.LabelValues{"env": {"test"}}
	e.ap.UpsertRole(dev)
	return rootCA
}

// TestRootUserInLeaf: a certificate from a trusted root's user CA is
// accepted, with its roles mapped through the role_map, and its sessions
// are audited with the root user, their cluster and both role lists.
func TestRootUserInLeaf(t *testing.T) {
	rec := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) { c.Audit = rec })
	rootCA := trustRoot(t, e)
	// The leaf's own "access" role is deleted: a root user could reach
	// this node only through the mapped "dev".
	e.ap.DeleteRole("access")

	signer := rootCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Cluster: rootCluster, Roles: []string{"access"}})
	c, err := e.dialAs(e.me, signer)
	require.NoError(t, err)
	defer c.Close()
	out, _, err := run(t, c, "echo -n hi")
	require.NoError(t, err)
	require.Equal(t, "hi", out)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start, err := rec.Wait(ctx, events.SessionStart, nil)
	require.NoError(t, err)
	require.Equal(t, "alice", start.User)
	require.Equal(t, rootCluster, start.Fields[events.FieldUserCluster])
	require.Equal(t, []string{"access"}, start.Fields[events.FieldRemoteRoles])
	require.Equal(t, []string{"dev"}, start.Fields[events.FieldRoles])

	// The mapped role's node_labels decide: dev reaches env=test only.
	e.nodeMu.Lock()
	e.node.Labels = map[string]string{"env": "prod"}
	e.nodeMu.Unlock()
	_, err = e.dialAs(e.me, signer)
	require.Error(t, err)
	e.requireLog("Access denied.", `access to node \"node1\" denied: no role matches its labels`)
}

// TestRootUserRefusals are the ways a certificate from another cluster
// must not get in, each as the attack it is, with the reason the audit
// event gives (the user only ever sees "unable to authenticate").
func TestRootUserRefusals(t *testing.T) {
	rec := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) { c.Audit = rec })
	rootCA := trustRoot(t, e)
	trust, err := e.ap.GetTrustedCluster(context.Background(), rootCluster)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for i, c := range []struct {
		name   string
		ca     *srvtest.CA
		cert   srvtest.UserCert
		setup  func()
		reason string
	}{
		{
			name: "roles that map to nothing",
			ca:   rootCA, cert: srvtest.UserCert{Cluster: rootCluster, Roles: []string{"auditor", "ops"}},
			reason: `roles [auditor ops] of user "bob-0" of cluster "root" map to no role here: no role_map entry of trusted_cluster "root" matches [auditor ops]`,
		},
		{
			// A root's "admin" or "dev" is not this cluster's: the name
			// of a local role in a root certificate grants nothing.
			name: "a local role name in a root certificate",
			ca:   rootCA, cert: srvtest.UserCert{Cluster: rootCluster, Roles: []string{"dev"}},
			reason: "map to no role here",
		},
		{
			// This cluster's users must not pose as the root's: a
			// certificate claiming cluster root, signed by the leaf's CA.
			name: "this cluster's CA signing for the root",
			ca:   e.userCA, cert: srvtest.UserCert{Cluster: rootCluster},
			reason: `certificate is not signed by the user CA of cluster "root"`,
		},
		{
			// And the root's CA cannot sign for this cluster's users.
			name: "the root's CA signing a local user",
			ca:   rootCA, cert: srvtest.UserCert{Cluster: testCluster},
			reason: `certificate is not signed by the user CA of cluster "example"`,
		},
		{
			name: "a cluster not trusted",
			ca:   srvtest.NewCA(t), cert: srvtest.UserCert{Cluster: "elsewhere"},
			reason: `certificate was issued by cluster "elsewhere", which this cluster does not trust`,
		},
		{
			name: "trust disabled",
			ca:   rootCA, cert: srvtest.UserCert{Cluster: rootCluster},
			setup: func() {
				off := *trust
				off.Spec.Enabled = false
				e.ap.UpsertTrustedCluster(&off)
			},
			reason: `certificate was issued by cluster "root", which this cluster does not trust`,
		},
		{
			name: "trust removed",
			ca:   rootCA, cert: srvtest.UserCert{Cluster: rootCluster},
			setup:  func() { e.ap.DeleteTrustedCluster(rootCluster) },
			reason: `certificate was issued by cluster "root", which this cluster does not trust`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.ap.UpsertTrustedCluster(trust)
			if c.setup != nil {
				c.setup()
			}
			user := fmt.Sprintf("bob-%d", i)
			c.cert.User, c.cert.Logins = user, []string{e.me}
			_, err := e.dialAs(e.me, c.ca.UserSigner(t, c.cert))
			require.Error(t, err)
			require.Contains(t, err.Error(), "unable to authenticate")
			ev, err := rec.Wait(ctx, events.AccessDenied, func(ev events.Event) bool { return ev.User == user })
			require.NoError(t, err)
			require.Contains(t, ev.Fields[events.FieldReason], c.reason)
			if c.cert.Cluster == testCluster {
				require.NotContains(t, ev.Fields, events.FieldUserCluster)
			} else {
				require.Equal(t, c.cert.Cluster, ev.Fields[events.FieldUserCluster])
			}
		})
	}
}

// TestRootUserNextSessionAfterTrustRemoved: removing the trusted_cluster
// refuses the next session of a connection that is already open (what
// `pctl rm trusted_cluster/ROOT` promises for sessions, not only for new
// connections). The access point announces no changes here: the trust
// sweep would end the connection first (TestTrustWithdrawnEndsOpenConnections),
// and this check must hold on its own.
func TestRootUserNextSessionAfterTrustRemoved(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.AccessPoint = silentAccessPoint{c.AccessPoint} })
	rootCA := trustRoot(t, e)
	signer := rootCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Cluster: rootCluster, Roles: []string{"access"}})
	c, err := e.dialAs(e.me, signer)
	require.NoError(t, err)
	defer c.Close()
	_, _, err = run(t, c, "true")
	require.NoError(t, err)

	e.ap.DeleteTrustedCluster(rootCluster)
	_, err = c.NewSession()
	require.Error(t, err)
	e.requireLog(`which this cluster does not trust`)
}

// TestIdentifyRootUser: what a leaf's proxy accepts of a root proxy's
// routing request is exactly what its SSH servers accept of the user,
// minus the login: a trusted root's certificate, valid now, roles mapped;
// never a certificate of this cluster itself.
func TestIdentifyRootUser(t *testing.T) {
	e := newTestEnv(t)
	rootCA := trustRoot(t, e)
	ctx := context.Background()
	cert := func(ca *srvtest.CA, u srvtest.UserCert) *ssh.Certificate {
		if u.Logins == nil {
			u.Logins = []string{e.me}
		}
		if u.Now.IsZero() {
			u.Now = time.Now()
		}
		return ca.SignUser(t, srvtest.NewSigner(t).PublicKey(), u)
	}

	id, err := IdentifyRootUser(ctx, e.ap, testCluster, e.clock, cert(rootCA, srvtest.UserCert{User: "alice", Cluster: rootCluster, Roles: []string{"access"}}))
	require.NoError(t, err)
	require.Equal(t, "alice", id.User)
	require.Equal(t, []string{"dev"}, id.Roles)
	require.Equal(t, []string{"access"}, id.RemoteRoles)
	require.NotNil(t, id.Checker)
	require.True(t, id.CanReach(services.Node{UUID: "n", Hostname: "n", Labels: map[string]string{"env": "test"}}))
	require.False(t, id.CanReach(services.Node{UUID: "n", Hostname: "n", Labels: map[string]string{"env": "prod"}}))

	for _, c := range []struct {
		name string
		cert *ssh.Certificate
		want string
	}{
		{"this cluster's own user", cert(e.userCA, srvtest.UserCert{User: "bob", Cluster: testCluster}), "issued by this cluster, not by a root"},
		{"roles that map to nothing", cert(rootCA, srvtest.UserCert{User: "bob", Cluster: rootCluster, Roles: []string{"ops"}}), "map to no role here"},
		{"another CA", cert(srvtest.NewCA(t), srvtest.UserCert{User: "bob", Cluster: rootCluster}), `not signed by the user CA of cluster "root"`},
		{"expired", cert(rootCA, srvtest.UserCert{User: "bob", Cluster: rootCluster, Now: time.Now().Add(-2 * time.Hour), TTL: time.Hour}), "certificate expired"},
		{"a cluster not trusted", cert(srvtest.NewCA(t), srvtest.UserCert{User: "bob", Cluster: "elsewhere"}), "which this cluster does not trust"},
		{"a host certificate", func() *ssh.Certificate {
			c := cert(rootCA, srvtest.UserCert{User: "bob", Cluster: rootCluster})
			c.CertType = ssh.HostCert
			return c
		}(), "not a user certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := IdentifyRootUser(ctx, e.ap, testCluster, e.clock, c.cert)
			require.Error(t, err)
			require.True(t, trace.IsAccessDenied(err), "%v", err)
			require.Contains(t, err.Error(), c.want)
		})
	}
}

// TestTrustWithdrawnEndsOpenConnections: a root user's shell, open
// before the leaf stops trusting what signed it, ends at the change with
// the reason on stderr and a conn.terminated event, for each way trust
// goes: the trusted_cluster disabled or removed, or the root's user CA
// rotated to a key that did not sign the certificate. A connection of
// the leaf's own users stays up through all of it.
func TestTrustWithdrawnEndsOpenConnections(t *testing.T) {
	for _, c := range []struct {
		name     string
		withdraw func(e *testEnv)
		reason   string
	}{
		{"trusted_cluster removed", func(e *testEnv) { e.ap.DeleteTrustedCluster(rootCluster) },
			`cluster "root" is no longer trusted here (its trusted_cluster was removed)`},
		{"trusted_cluster disabled", func(e *testEnv) {
			tc, err := e.ap.GetTrustedCluster(context.Background(), rootCluster)
			require.NoError(t, err)
			tc.Spec.Enabled = false
			e.ap.UpsertTrustedCluster(tc)
		}, `cluster "root" is no longer trusted here (its trusted_cluster was disabled)`},
		{"root user CA rotated", func(e *testEnv) {
			e.ap.SetCA(srvtest.NewCA(t).CertAuthority(rootCluster, services.UserCA))
		}, `the user CA key of cluster "root" that signed this certificate is no longer trusted here`},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := events.NewRecorder()
			e := newTestEnv(t, func(c *Config) { c.Audit = rec })
			rootCA := trustRoot(t, e)
			root, err := e.dialAs(e.me, rootCA.UserSigner(t, srvtest.UserCert{User: "alice", Logins: []string{e.me}, Cluster: rootCluster, Roles: []string{"access"}}))
			require.NoError(t, err)
			defer root.Close()
			sess, err := root.NewSession()
			require.NoError(t, err)
			stderr, err := sess.StderrPipe()
			require.NoError(t, err)
			errOut := watchOutput(stderr)
			require.NoError(t, sess.Start("sleep 600"))
			local := e.dial()
			defer local.Close()
			// Any other change sweeps too, and ends nothing.
			e.ap.UpsertTrustedCluster(&services.TrustedCluster{Metadata: services.Metadata{Name: "other"}, Spec: services.TrustedClusterSpec{Enabled: true}})
			_, _, err = run(t, root, "true")
			require.NoError(t, err, "a change that keeps the trust ends nothing")

			ended := make(chan error, 1)
			go func() { ended <- root.Wait() }()
			c.withdraw(e)
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("the root user's open connection was not ended")
			}
			require.Contains(t, errOut.waitFor(t, "no longer"), "postern: "+c.reason+"; connection closed")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ev, err := rec.Wait(ctx, events.ConnTerminated, nil)
			require.NoError(t, err)
			require.Equal(t, "alice", ev.User)
			require.Equal(t, c.reason, ev.Fields[events.FieldReason])
			require.Equal(t, rootCluster, ev.Fields[events.FieldUserCluster])
			require.Equal(t, "trust", ev.Fields[events.FieldKind])

			_, _, err = run(t, local, "true")
			require.NoError(t, err, "the leaf's own user's connection must survive")
		})
	}
}

// silentAccessPoint hides TrustChanges: no trust sweep runs.
type silentAccessPoint struct{ AccessPoint }
