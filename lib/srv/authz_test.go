package srv

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

func TestEnvAllowed(t *testing.T) {
	for name, want := range map[string]bool{
		"LANG": true, "LC_ALL": true, "LC_CTYPE": true, "TERM": true, "COLORTERM": true, "TZ": true,
		"LC_": false, "LD_PRELOAD": false, "PATH": false, "BASH_ENV": false, "HOME": false,
		"SSH_AUTH_SOCK": false, "lang": false, "": false,
	} {
		require.Equal(t, want, envAllowed(name), name)
	}
}

func TestIdentityFromCert(t *testing.T) {
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
			id, err := identityFromCert(c.cert, "root")
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

func TestPermitsFor(t *testing.T) {
	node := &services.Node{Hostname: "n", Labels: map[string]string{"env": "prod"}}
	roleWith := func(agent, pf bool, labels map[string]services.LabelValues) *services.Role {
		return &services.Role{Metadata: services.Metadata{Name: "r"}, Spec: services.RoleSpec{
			Logins: []string{"root"}, NodeLabels: labels, ForwardAgent: agent, PortForwarding: pf}}
	}
	all := map[string]services.LabelValues{"*": {"*"}}
	allPermits := map[string]string{extPermitPTY: "", extPermitPortForwarding: "", extPermitAgentForwarding: ""}
	cases := []struct {
		name string
		ext  map[string]string
		role *services.Role
		want Permits
	}{
		{"everything", allPermits, roleWith(true, true, all), Permits{true, true, true}},
		{"role denies forwarding", allPermits, roleWith(false, false, all), Permits{PTY: true}},
		{"cert denies", map[string]string{}, roleWith(true, true, all), Permits{}},
		{"role does not reach node", allPermits, roleWith(true, true, map[string]services.LabelValues{"env": {"dev"}}), Permits{PTY: true}},
		{"only agent", map[string]string{extPermitAgentForwarding: ""}, roleWith(true, true, all), Permits{AgentForwarding: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checker := services.NewAccessChecker([]*services.Role{c.role}, nil)
			require.Equal(t, c.want, permitsFor(c.ext, checker, node))
		})
	}
}

func TestAuthorizeNode(t *testing.T) {
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
			err := authorizeNode(checker, node, c.login)
			if c.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

func TestIsUserAuthority(t *testing.T) {
	ca, other := srvtest.NewCA(t), srvtest.NewCA(t)
	res := ca.CertAuthority("c", services.UserCA)
	res.SSHPublicKeys = append([]string{"garbage"}, res.SSHPublicKeys...)
	require.True(t, isUserAuthority(res, ca.Signer.PublicKey()))
	require.False(t, isUserAuthority(res, other.Signer.PublicKey()))
	require.False(t, isUserAuthority(nil, ca.Signer.PublicKey()))
}

func TestNewAccessCheckerSkipsDeletedRoles(t *testing.T) {
	ap := srvtest.NewAccessPoint()
	ap.UpsertRole(srvtest.AccessRole())
	checker, err := NewAccessChecker(context.Background(), ap, []string{"access", "deleted"}, map[string][]string{"logins": {"x"}})
	require.NoError(t, err)
	require.Equal(t, []string{"access"}, checker.RoleNames())
}

// FuzzParseRequests feeds arbitrary payloads to every parser of
// client-supplied request data: none may panic, and accepted sizes fit a
// terminal.
func FuzzParseRequests(f *testing.F) {
	f.Add(ssh.Marshal(ptyRequest{Term: "xterm", Columns: 80, Rows: 24}))
	f.Add(ssh.Marshal(windowChange{Columns: 132, Rows: 50}))
	f.Add(ssh.Marshal(signalRequest{Signal: "TERM"}))
	f.Add(ssh.Marshal(envRequest{Name: "LANG", Value: "C"}))
	f.Add([]byte{0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, payload []byte) {
		if p, err := parsePtyRequest(payload); err == nil {
			require.LessOrEqual(t, p.Columns, uint32(maxTerminalSize))
		}
		if w, err := parseWindowChange(payload); err == nil {
			require.LessOrEqual(t, w.Rows, uint32(maxTerminalSize))
		}
		_, _ = parseSignal(payload)
		var e envRequest
		if ssh.Unmarshal(payload, &e) == nil {
			_ = envAllowed(e.Name)
		}
		var d directTCPIPPayload
		_ = ssh.Unmarshal(payload, &d)
		var fw forwardRequest
		_ = ssh.Unmarshal(payload, &fw)
	})
}

// FuzzIdentityFromCert: certificate extensions are outside input too
// (signed, but by whatever issued them).
func FuzzIdentityFromCert(f *testing.F) {
	f.Add("alice", `["access"]`, `{"logins":["root"]}`)
	f.Add("", `[]`, ``)
	f.Add("x", `[1,2`, `{"logins":"root"}`)
	f.Fuzz(func(t *testing.T, user, roles, traits string) {
		cert := &ssh.Certificate{Permissions: ssh.Permissions{Extensions: map[string]string{
			services.CertExtensionUser: user, services.CertExtensionRoles: roles, services.CertExtensionTraits: traits,
		}}}
		id, err := identityFromCert(cert, "root")
		if err == nil {
			require.NotEmpty(t, id.User)
		}
	})
}
