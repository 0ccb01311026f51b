package services

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
)

const roleYAML = `# a developer role
kind: role
version: v1
metadata:
  name: dev
  description: developers
spec:
  logins: ['{{internal.logins}}', ubuntu]
  node_labels:
    env: [dev, staging]
    team: platform
  forward_agent: true
  max_session_ttl: 8h
`

func TestUnmarshalResourceRole(t *testing.T) {
	kind, v, err := UnmarshalResource([]byte(roleYAML), "dev.yaml")
	require.NoError(t, err)
	require.Equal(t, KindRole, kind)
	r := v.(*Role)
	require.Equal(t, "dev", r.Metadata.Name)
	require.Equal(t, []string{"{{internal.logins}}", "ubuntu"}, r.Spec.Logins)
	require.Equal(t, map[string]LabelValues{"env": {"dev", "staging"}, "team": {"platform"}}, r.Spec.NodeLabels)
	require.True(t, r.Spec.ForwardAgent)
	require.False(t, r.Spec.PortForwarding)
	require.Equal(t, 8*time.Hour, r.Spec.MaxSessionTTL.Value())

	// The same resource as JSON.
	js := `{"kind":"role","metadata":{"name":"dev"},"spec":{"logins":["root"],"node_labels":{"*":"*"},"max_session_ttl":3600}}`
	kind, v, err = UnmarshalResource([]byte(js), "dev.json")
	require.NoError(t, err)
	require.Equal(t, KindRole, kind)
	require.Equal(t, time.Hour, v.(*Role).Spec.MaxSessionTTL.Value())
	require.Equal(t, V1, v.(*Role).Version)
}

func TestUnmarshalResourceNetworking(t *testing.T) {
	in := "kind: cluster_networking_config\nmetadata:\n  name: cluster_networking_config\nspec:\n  routing_strategy: most_recent\n  case_insensitive_routing: true\n  ssh_dial_timeout: 5s\n"
	kind, v, err := UnmarshalResource([]byte(in), "net.yaml")
	require.NoError(t, err)
	require.Equal(t, KindClusterNetworking, kind)
	c := v.(*ClusterNetworkingConfig)
	require.Equal(t, RoutingMostRecent, c.Spec.RoutingStrategy)
	require.True(t, c.Spec.CaseInsensitiveRouting)
	require.Equal(t, 5*time.Second, c.Spec.SSHDialTimeout.Value())

	// metadata may be omitted for the singleton.
	_, v, err = UnmarshalResource([]byte("kind: cluster_networking_config\nspec: {}\n"), "net.yaml")
	require.NoError(t, err)
	require.Equal(t, RoutingUnambiguousMatch, v.(*ClusterNetworkingConfig).Spec.RoutingStrategy)
}

func TestUnmarshalResourceErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"unknown spec key", "kind: role\nmetadata:\n  name: dev\nspec:\n  logins: [root]\n  forward_agnet: true\n",
			`role.yaml:6: unknown field "forward_agnet" in spec: known fields are logins, node_labels, forward_agent, port_forwarding, max_session_ttl, admin`},
		{"unknown top key", "kind: role\nmetdata:\n  name: dev\n", `role.yaml:2: unknown field "metdata" in the top level`},
		{"unknown metadata key", "kind: role\nmetadata:\n  name: dev\n  labels: {}\n", `role.yaml:4: unknown field "labels" in metadata`},
		{"bad bool", "kind: role\nmetadata: {name: dev}\nspec:\n  forward_agent: maybe\n", `role.yaml:4: spec.forward_agent: want true or false, got the string "maybe"`},
		{"bad duration", "kind: role\nmetadata: {name: dev}\nspec:\n  max_session_ttl: 8 hours\n", `role.yaml:4: spec.max_session_ttl: invalid duration "8 hours"`},
		{"bad label value", "kind: role\nmetadata: {name: dev}\nspec:\n  node_labels:\n    env: {a: b}\n", `role.yaml:5: spec.node_labels.env: label values: want a string or a list of strings`},
		{"logins not a list", "kind: role\nmetadata: {name: dev}\nspec:\n  logins: root\n", `role.yaml:4: spec.logins: want a list, got the string "root"`},
		{"missing kind", "metadata: {name: dev}\n", `role.yaml:1: missing "kind"`},
		{"unknown kind", "\nkind: user\n", `role.yaml:2: unsupported kind "user": want one of "role", "cluster_networking_config", "trusted_cluster", "oidc_connector" or "auth_preference"`},
		{"not a mapping", "- a\n- b\n", `role.yaml:1: want a mapping`},
		{"empty", "", `role.yaml: empty file`},
		{"two documents", "kind: role\nmetadata: {name: a}\n---\nkind: role\n", `role.yaml:4: a second document`},
		{"syntax", "kind: role\n  metadata: [\n", `role.yaml: `},
		{"duplicate", "kind: role\nmetadata: {name: a}\nspec:\n  logins: [a]\n  logins: [b]\n", `role.yaml:5: duplicate field "logins" in spec`},
		{"alias", "kind: role\nmetadata: &m {name: a}\nspec: {}\n", `role.yaml:2: metadata: YAML anchors and aliases are not supported`},
		{"validation", "kind: role\nmetadata: {name: 'a b'}\n", `role.yaml: role: metadata.name: role name "a b" contains ' '`},
		{"bad strategy", "kind: cluster_networking_config\nspec: {routing_strategy: random}\n", `role.yaml: cluster networking config: spec.routing_strategy is "random"`},
		{"json unknown", `{"kind":"role","metadata":{"name":"a"},"spec":{"x":1}}`, `role.yaml:1: unknown field "x" in spec`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := UnmarshalResource([]byte(tc.in), "role.yaml")
			require.Error(t, err)
			require.True(t, trace.IsBadParameter(err), "%v", err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestMarshalResourceYAMLRoundTrip(t *testing.T) {
	_, v, err := UnmarshalResource([]byte(roleYAML), "dev.yaml")
	require.NoError(t, err)
	out, err := MarshalResourceYAML(v)
	require.NoError(t, err)
	require.Contains(t, string(out), "kind: role\n")
	require.Contains(t, string(out), "max_session_ttl: 8h0m0s\n")
	_, v2, err := UnmarshalResource(out, "out.yaml")
	require.NoError(t, err)
	require.Equal(t, v, v2)

	// Strings that look like other YAML types stay strings.
	r := &Role{Metadata: Metadata{Name: "x"}, Spec: RoleSpec{Logins: []string{"true", "123", "null"},
		NodeLabels: map[string]LabelValues{"on": {"yes"}}}}
	require.NoError(t, r.CheckAndSetDefaults())
	out, err = MarshalResourceYAML(r)
	require.NoError(t, err)
	_, v3, err := UnmarshalResource(out, "out.yaml")
	require.NoError(t, err, string(out))
	require.Equal(t, r, v3)

	// A list renders as a YAML sequence.
	out, err = MarshalResourceYAML(PresetRoles())
	require.NoError(t, err)
	require.Contains(t, string(out), "- kind: role\n")
}

func FuzzUnmarshalResource(f *testing.F) {
	f.Add([]byte(roleYAML))
	f.Add([]byte("kind: cluster_networking_config\nspec: {routing_strategy: most_recent, ssh_dial_timeout: 1}\n"))
	f.Add([]byte(`{"kind":"role","metadata":{"name":"a"},"spec":{"node_labels":{"*":"*"}}}`))
	f.Add([]byte("kind: auth_preference\nspec: {second_factor: on, passwordless: true, webauthn: {rp_id: example.com, origins: [https://a.example.com:3080]}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		kind, v, err := UnmarshalResource(data, "f.yaml")
		if err != nil {
			require.Nil(t, v)
			return
		}
		// Whatever is accepted renders and reads back the same.
		out, err := MarshalResourceYAML(v)
		require.NoError(t, err)
		kind2, v2, err := UnmarshalResource(out, "f.yaml")
		require.NoError(t, err, "re-parse of:\n%s", out)
		require.Equal(t, kind, kind2)
		// Compare what is stored: [] and nil are the same to omitempty.
		j1, err := json.Marshal(v)
		require.NoError(t, err)
		j2, err := json.Marshal(v2)
		require.NoError(t, err)
		require.JSONEq(t, string(j1), string(j2))
	})
}
