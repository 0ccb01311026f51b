package services

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

func TestNames(t *testing.T) {
	for _, ok := range []string{"alice", "alice@example.com", "a.b-c_d", "a+tag@x", "0x"} {
		require.NoError(t, CheckUserName(ok), ok)
	}
	for name, want := range map[string]string{
		"":                       "user name is empty",
		"-alice":                 `user name "-alice" must start with a letter or a digit`,
		"../etc":                 `user name "../etc" must start with a letter or a digit`,
		"al ice":                 `user name "al ice" contains ' '`,
		"al/ice":                 `contains '/'`,
		"élodie":                 "must start with a letter",
		"a\x00":                  `contains '\x00'`,
		strings.Repeat("a", 300): "longer than 253",
	} {
		err := CheckUserName(name)
		require.True(t, trace.IsBadParameter(err), name)
		require.ErrorContains(t, err, want)
	}
	require.NoError(t, CheckRoleName("dev-ops.v2"))
	require.ErrorContains(t, CheckRoleName("a@b"), `role name "a@b" contains '@'`)
	require.ErrorContains(t, CheckClusterName("a:b"), `cluster name "a:b" contains ':'`)
}

func TestRoleCheckAndSetDefaults(t *testing.T) {
	r := &Role{Metadata: Metadata{Name: "dev"}, Spec: RoleSpec{
		Logins:     []string{"{{internal.logins}}", "ubuntu"},
		NodeLabels: map[string]LabelValues{"env": {"dev", "^stag.*$"}},
	}}
	require.NoError(t, r.CheckAndSetDefaults())
	require.Equal(t, KindRole, r.Kind)
	require.Equal(t, V1, r.Version)
	require.Equal(t, DefaultMaxSessionTTL, r.Spec.MaxSessionTTL.Value())

	for _, tc := range []struct {
		name string
		mod  func(r *Role)
		want string
	}{
		{"kind", func(r *Role) { r.Kind = "user" }, `kind is "user"`},
		{"version", func(r *Role) { r.Version = "v9" }, `unsupported version "v9"`},
		{"name", func(r *Role) { r.Metadata.Name = "a b" }, "metadata.name"},
		{"empty name", func(r *Role) { r.Metadata.Name = "" }, "role name is empty"},
		{"template", func(r *Role) { r.Spec.Logins = []string{"{{external.x}}"} }, "unsupported template"},
		{"login", func(r *Role) { r.Spec.Logins = []string{"-oProxyCommand"} }, "spec.logins"},
		{"labels", func(r *Role) { r.Spec.NodeLabels = map[string]LabelValues{"*": {"prod"}} }, "spec.node_labels"},
		{"regexp", func(r *Role) { r.Spec.NodeLabels = map[string]LabelValues{"env": {"^($"}} }, "invalid regular expression"},
		{"ttl", func(r *Role) { r.Spec.MaxSessionTTL = Duration(-time.Hour) }, "max_session_ttl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Role{Metadata: Metadata{Name: "dev"}}
			tc.mod(r)
			err := r.CheckAndSetDefaults()
			require.True(t, trace.IsBadParameter(err), "%v", err)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestNetworkingCheckAndSetDefaults(t *testing.T) {
	c := &ClusterNetworkingConfig{}
	require.NoError(t, c.CheckAndSetDefaults())
	require.Equal(t, KindClusterNetworking, c.Kind)
	require.Equal(t, NetworkingConfigName, c.Metadata.Name)
	require.Equal(t, RoutingUnambiguousMatch, c.Spec.RoutingStrategy)
	require.Equal(t, DefaultSSHDialTimeout, c.Spec.SSHDialTimeout.Value())

	c = &ClusterNetworkingConfig{Spec: ClusterNetworkingConfigSpec{RoutingStrategy: RoutingMostRecent, SSHDialTimeout: Duration(time.Second)}}
	require.NoError(t, c.CheckAndSetDefaults())
	require.Equal(t, time.Second, c.Spec.SSHDialTimeout.Value())

	for _, bad := range []*ClusterNetworkingConfig{
		{Spec: ClusterNetworkingConfigSpec{RoutingStrategy: "first"}},
		{Spec: ClusterNetworkingConfigSpec{SSHDialTimeout: Duration(-1)}},
		{Kind: "role"},
		{Metadata: Metadata{Name: "other"}},
	} {
		require.True(t, trace.IsBadParameter(bad.CheckAndSetDefaults()))
	}
}

func TestNodeUserTokenCAValidation(t *testing.T) {
	n := &Node{UUID: "u1", Addr: "[::1]:3022", Cluster: "c1"}
	require.NoError(t, n.CheckAndSetDefaults())
	require.Equal(t, "u1", n.Hostname, "hostname defaults to the uuid")
	for _, bad := range []Node{
		{UUID: "", Addr: "h:1", Cluster: "c"},
		{UUID: "u", Addr: "h:1", Cluster: ""},
		{UUID: "u", Addr: "h:0", Cluster: "c"},
		{UUID: "u", Addr: "h:99999", Cluster: "c"},
		{UUID: "u", Addr: ":22", Cluster: "c"},
		{UUID: "u", Addr: "h:1", Cluster: "c", Hostname: "a b"},
		{UUID: "u", Addr: "h:1", Cluster: "c", Labels: map[string]string{"": "x"}},
	} {
		require.True(t, trace.IsBadParameter(bad.CheckAndSetDefaults()), "%+v", bad)
	}
	u := &User{Name: "bob", Traits: map[string][]string{TraitLogins: {"root", "-x"}}}
	require.ErrorContains(t, u.CheckAndSetDefaults(), `login "-x"`)
	require.ErrorContains(t, (&User{Name: "bob", Roles: []string{"a/b"}}).CheckAndSetDefaults(), "roles")

	tok := &Token{Name: "t", Type: "node", Expires: time.Now()}
	require.NoError(t, tok.CheckAndSetDefaults())
	tok.Type = "admin"
	require.ErrorContains(t, tok.CheckAndSetDefaults(), `token type is "admin"`)

	require.ErrorContains(t, (&CertAuthority{Type: "x", ClusterName: "c"}).CheckAndSetDefaults(), "type")
	require.ErrorContains(t, (&CertAuthority{Type: UserCA, ClusterName: "c", SSHPublicKeys: []string{"junk"}}).CheckAndSetDefaults(), "ssh_public_keys[0]")
	require.NoError(t, (&CertAuthority{Type: UserCA, ClusterName: "c", SSHPublicKeys: []string{testPublicKey(t)}}).CheckAndSetDefaults())
}

func TestLabelValues(t *testing.T) {
	var m map[string]LabelValues
	require.NoError(t, json.Unmarshal([]byte(`{"a":"x","b":["y","z"],"c":[]}`), &m))
	require.Equal(t, map[string]LabelValues{"a": {"x"}, "b": {"y", "z"}, "c": {}}, m)
	require.Error(t, json.Unmarshal([]byte(`{"a":1}`), &m))
	require.Error(t, json.Unmarshal([]byte(`{"a":{"b":"c"}}`), &m))

	var y map[string]LabelValues
	require.NoError(t, yaml.Unmarshal([]byte("a: x\nb: [y, z]\n'*': '*'\n"), &y))
	require.Equal(t, map[string]LabelValues{"a": {"x"}, "b": {"y", "z"}, "*": {"*"}}, y)
	require.ErrorContains(t, yaml.Unmarshal([]byte("a: {b: c}\n"), &y), "line 1")
}
