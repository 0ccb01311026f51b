package authz

import (
	"context"
	"slices"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
)

func TestFromCertificate(t *testing.T) {
	mk := func(ext map[string]string, keyID string) *ssh.Certificate {
		return &ssh.Certificate{KeyId: keyID, Permissions: ssh.Permissions{Extensions: ext}}
	}
	cases := []struct {
		name    string
		cert    *ssh.Certificate
		wantErr string
		want    *Identity
	}{
		{"full", mk(map[string]string{
			services.CertExtensionUser:    "alice",
			services.CertExtensionRoles:   `["access","dev"]`,
			services.CertExtensionTraits:  `{"logins":["root","alice"]}`,
			services.CertExtensionCluster: "example",
		}, "alice"), "", &Identity{Login: "root", User: "alice", Roles: []string{"access", "dev"},
			Traits: map[string][]string{"logins": {"root", "alice"}}, Cluster: "example"}},
		{"user from key id", mk(map[string]string{services.CertExtensionRoles: `[]`}, "bob"), "",
			&Identity{Login: "root", User: "bob", Roles: []string{}}},
		{"no user", mk(map[string]string{services.CertExtensionRoles: `[]`}, ""), "names no Postern user", nil},
		{"no roles", mk(map[string]string{services.CertExtensionUser: "a"}, ""), "no roles extension", nil},
		{"bad roles", mk(map[string]string{services.CertExtensionUser: "a", services.CertExtensionRoles: `{"x":1}`}, ""), "malformed roles", nil},
		{"trailing roles", mk(map[string]string{services.CertExtensionUser: "a", services.CertExtensionRoles: `[] []`}, ""), "malformed roles", nil},
		{"bad traits", mk(map[string]string{services.CertExtensionUser: "a", services.CertExtensionRoles: `[]`, services.CertExtensionTraits: `[1]`}, ""), "malformed traits", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, err := FromCertificate(c.cert, "root")
			if c.wantErr != "" {
				require.ErrorContains(t, err, c.wantErr)
				return
			}
			require.NoError(t, err)
			id.Cert = nil
			require.Equal(t, c.want, id)
		})
	}
}

func TestCheckLogin(t *testing.T) {
	node := &services.Node{Hostname: "db1", Labels: map[string]string{"env": "prod", "team": "db"}}
	cases := []struct {
		name   string
		labels map[string]services.LabelValues
		logins []string
		traits []string
		login  string
		ok     bool
	}{
		{"template login", map[string]services.LabelValues{"*": {"*"}}, []string{"{{internal.logins}}"}, []string{"alice"}, "alice", true},
		{"template other login", map[string]services.LabelValues{"*": {"*"}}, []string{"{{internal.logins}}"}, []string{"alice"}, "root", false},
		{"literal login", map[string]services.LabelValues{"env": {"prod"}}, []string{"root"}, nil, "root", true},
		{"regexp labels", map[string]services.LabelValues{"team": {"^d.*$"}}, []string{"root"}, nil, "root", true},
		{"labels miss", map[string]services.LabelValues{"env": {"dev"}}, []string{"root"}, nil, "root", false},
		{"empty selector", nil, []string{"root"}, nil, "root", false},
		{"empty login", map[string]services.LabelValues{"*": {"*"}}, []string{"root"}, nil, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			role := &services.Role{Metadata: services.Metadata{Name: "r"}, Spec: services.RoleSpec{Logins: c.logins, NodeLabels: c.labels}}
			checker := services.NewAccessChecker([]*services.Role{role}, map[string][]string{services.TraitLogins: c.traits})
			id := &Identity{User: "alice", Checker: checker, Cert: &ssh.Certificate{ValidPrincipals: []string{c.login}}}
			err := id.CheckLogin(node, c.login)
			if c.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

// TestCheckLoginNeedsThePrincipal: a role that allows a login does not
// let a certificate without it use it (the web terminal picks the login,
// so the certificate is what bounds it).
func TestCheckLoginNeedsThePrincipal(t *testing.T) {
	role := &services.Role{Metadata: services.Metadata{Name: "r"}, Spec: services.RoleSpec{Logins: []string{"root", "alice"}, NodeLabels: map[string]services.LabelValues{"*": {"*"}}}}
	id := &Identity{User: "alice", Checker: services.NewAccessChecker([]*services.Role{role}, nil), Cert: &ssh.Certificate{ValidPrincipals: []string{"alice"}}}
	node := &services.Node{Hostname: "db1"}
	require.NoError(t, id.CheckLogin(node, "alice"))
	require.ErrorContains(t, id.CheckLogin(node, "root"), `login "root" is not in the certificate`)
	require.Equal(t, []string{"alice"}, id.LoginsOn(node))
	require.True(t, id.CanReach(*node))
	require.False(t, (&Identity{User: "x"}).CanReach(*node), "no checker grants nothing")
	require.Error(t, (&Identity{User: "x"}).CheckLogin(node, "alice"))
}

// roleMap is a RoleGetter over a map.
type roleMap map[string]*services.Role

func (m roleMap) GetRole(_ context.Context, name string) (*services.Role, error) {
	r, ok := m[name]
	if !ok {
		return nil, trace.NotFound("role %q not found", name)
	}
	return r, nil
}

func TestNewAccessCheckerSkipsDeletedRoles(t *testing.T) {
	ap := roleMap{"access": {Metadata: services.Metadata{Name: "access"}}}
	checker, err := NewAccessChecker(context.Background(), ap, []string{"access", "deleted"}, map[string][]string{"logins": {"x"}})
	require.NoError(t, err)
	require.Equal(t, []string{"access"}, checker.RoleNames())
}

// FuzzFromCertificate: certificate extensions are outside input too
// (signed, but by whatever issued them).
func FuzzFromCertificate(f *testing.F) {
	f.Add("alice", `["access"]`, `{"logins":["root"]}`)
	f.Add("", `[]`, ``)
	f.Add("x", `[1,2`, `{"logins":"root"}`)
	f.Fuzz(func(t *testing.T, user, roles, traits string) {
		cert := &ssh.Certificate{Permissions: ssh.Permissions{Extensions: map[string]string{
			services.CertExtensionUser: user, services.CertExtensionRoles: roles, services.CertExtensionTraits: traits,
		}}}
		id, err := FromCertificate(cert, "root")
		if err == nil {
			require.NotEmpty(t, id.User)
		}
	})
}

// TestMapTrusted is the table of a root user's identity in a leaf: roles
// go through the role_map, the root's role names themselves grant
// nothing, and the refusals name what did not map.
func TestMapTrusted(t *testing.T) {
	tc := func(enabled bool, m services.RoleMap) *services.TrustedCluster {
		return &services.TrustedCluster{Metadata: services.Metadata{Name: "root"}, Spec: services.TrustedClusterSpec{Enabled: enabled, RoleMap: m}}
	}
	for _, c := range []struct {
		name      string
		cluster   string
		roles     []string
		tc        *services.TrustedCluster
		wantRoles []string
		wantErr   string
	}{
		{"exact", "root", []string{"access"}, tc(true, services.RoleMap{{Remote: "access", Local: []string{"dev"}}}), []string{"dev"}, ""},
		{"glob and exact together", "root", []string{"access", "ops-eu"}, tc(true, services.RoleMap{
			{Remote: "ops-*", Local: []string{"ops"}}, {Remote: "access", Local: []string{"dev"}},
		}), []string{"dev", "ops"}, ""},
		{"partly mapped keeps what maps", "root", []string{"access", "auditor"}, tc(true, services.RoleMap{{Remote: "access", Local: []string{"dev"}}}), []string{"dev"}, ""},
		{"a root admin is not a leaf admin", "root", []string{"admin"}, tc(true, services.RoleMap{{Remote: "access", Local: []string{"dev"}}}), nil,
			`roles [admin] of user "alice" of cluster "root" map to no role here: no role_map entry of trusted_cluster "root" matches [admin]`},
		{"no roles at all", "root", []string{}, tc(true, services.RoleMap{{Remote: "*", Local: []string{"dev"}}}), nil, "map to no role here"},
		{"disabled trust", "root", []string{"access"}, tc(false, services.RoleMap{{Remote: "*", Local: []string{"dev"}}}), nil, `issued by cluster "root", which this cluster does not trust`},
		{"no trust", "root", []string{"access"}, nil, nil, "does not trust"},
		{"trust in another cluster", "other", []string{"access"}, tc(true, services.RoleMap{{Remote: "*", Local: []string{"dev"}}}), nil, `issued by cluster "other"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := &Identity{User: "alice", Cluster: c.cluster, Roles: slices.Clone(c.roles)}
			err := id.MapTrusted(c.tc)
			if c.wantErr != "" {
				require.ErrorContains(t, err, c.wantErr)
				require.True(t, trace.IsAccessDenied(err))
				require.Empty(t, id.Roles, "a refused identity keeps no roles")
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.wantRoles, id.Roles)
			require.Equal(t, c.roles, id.RemoteRoles)
			// A re-check maps the remote roles again, not the local ones.
			require.NoError(t, id.MapTrusted(c.tc))
			require.Equal(t, c.wantRoles, id.Roles)
		})
	}
}
