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
		{"template", func(r *Role) { r.Spec.Logins = []string{"{{internal.x}}"} }, "unsupported template"},
		{"external template without claim", func(r *Role) { r.Spec.Logins = []string{"{{external.}}"} }, "unsupported template"},
		{"login", func(r *Role) { r.Spec.Logins = []string{"-oProxyCommand"} }, "spec.logins"},
		{"labels", func(r *Role) { r.Spec.NodeLabels = map[string]LabelValues{"*": {"prod"}} }, "spec.node_labels"},
		{"regexp", func(r *Role) { r.Spec.NodeLabels = map[string]LabelValues{"env": {"^($"}} }, "invalid regular expression"},
		{"ttl", func(r *Role) { r.Spec.MaxSessionTTL = Duration(-time.Hour) }, "max_session_ttl"},
		{"session_recording", func(r *Role) { r.Spec.SessionRecording = "off" }, `spec.session_recording: unknown value "off", want "require" or "exempt"`},
		{"session_recording case", func(r *Role) { r.Spec.SessionRecording = "Require" }, `unknown value "Require"`},
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

// A role's session_recording is require, exempt or absent; require in any
// role beats exempt in another.
func TestRoleSessionRecording(t *testing.T) {
	for _, v := range []string{"", RecordingRequire, RecordingExempt} {
		r := &Role{Metadata: Metadata{Name: "dev"}, Spec: RoleSpec{SessionRecording: v}}
		require.NoError(t, r.CheckAndSetDefaults(), v)
	}
	role := func(name, mode string) *Role {
		return &Role{Metadata: Metadata{Name: name}, Spec: RoleSpec{SessionRecording: mode}}
	}
	for _, tc := range []struct {
		roles      []*Role
		mode, role string
	}{
		{nil, "", ""},
		{[]*Role{role("a", "")}, "", ""},
		{[]*Role{role("a", ""), role("b", RecordingExempt)}, RecordingExempt, "b"},
		{[]*Role{role("a", RecordingExempt), role("b", RecordingRequire)}, RecordingRequire, "b"},
		{[]*Role{role("a", RecordingRequire), role("b", RecordingExempt)}, RecordingRequire, "a"},
	} {
		mode, name := NewAccessChecker(tc.roles, nil).RecordingPolicy()
		require.Equal(t, tc.mode, mode)
		require.Equal(t, tc.role, name)
	}
}

func TestNetworkingCheckAndSetDefaults(t *testing.T) {
	c := &ClusterNetworkingConfig{}
	require.NoError(t, c.CheckAndSetDefaults())
	require.Equal(t, KindClusterNetworking, c.Kind)
	require.Equal(t, NetworkingConfigName, c.Metadata.Name)
	require.Equal(t, RoutingUnambiguousMatch, c.Spec.RoutingStrategy)
	require.Equal(t, DefaultSSHDialTimeout, c.Spec.SSHDialTimeout.Value())
	require.Equal(t, DefaultTunnelFindTimeout, c.Spec.TunnelFindTimeout.Value())
	require.Equal(t, DefaultTunnelKeepAliveInterval, c.Spec.KeepAliveInterval.Value())
	require.Equal(t, DefaultTunnelKeepAliveCountMax, c.Spec.KeepAliveCountMax)

	c = &ClusterNetworkingConfig{Spec: ClusterNetworkingConfigSpec{RoutingStrategy: RoutingMostRecent, SSHDialTimeout: Duration(time.Second)}}
	require.NoError(t, c.CheckAndSetDefaults())
	require.Equal(t, time.Second, c.Spec.SSHDialTimeout.Value())

	for _, bad := range []*ClusterNetworkingConfig{
		{Spec: ClusterNetworkingConfigSpec{RoutingStrategy: "first"}},
		{Spec: ClusterNetworkingConfigSpec{SSHDialTimeout: Duration(-1)}},
		{Spec: ClusterNetworkingConfigSpec{TunnelFindTimeout: Duration(-1)}},
		{Spec: ClusterNetworkingConfigSpec{TunnelFindTimeout: Duration(time.Hour)}},
		{Spec: ClusterNetworkingConfigSpec{KeepAliveInterval: Duration(-1)}},
		{Spec: ClusterNetworkingConfigSpec{KeepAliveCountMax: -1}},
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
	require.NoError(t, (&Node{UUID: "u2", Cluster: "c1", Tunnel: true}).CheckAndSetDefaults(), "a tunnel node has no addr")
	require.NoError(t, (&Node{UUID: "u3", Cluster: "c1", Addr: "h:22", Kind: NodeKindOpenSSH}).CheckAndSetDefaults(), "an OpenSSH node has no expiry")
	require.NoError(t, (&Node{UUID: "u4", Cluster: "c1", Addr: "h:22", Kind: NodeKindPostern}).CheckAndSetDefaults())
	require.EqualError(t, (&Node{UUID: "u5", Cluster: "c1", Kind: NodeKindOpenSSH, Tunnel: true}).CheckAndSetDefaults(),
		`node "u5": a node of kind "openssh" cannot be a tunnel node`)
	require.EqualError(t, (&Node{UUID: "u6", Cluster: "c1", Addr: "h:22", Kind: "telnet"}).CheckAndSetDefaults(),
		`node "u6": kind is "telnet", want "postern" or "openssh"`)
	require.Error(t, (&Node{UUID: "u7", Cluster: "c1", Kind: NodeKindOpenSSH}).CheckAndSetDefaults(), "an OpenSSH node needs an addr")
	for _, bad := range []Node{
		{UUID: "", Addr: "h:1", Cluster: "c"},
		{UUID: "u", Addr: "h:1", Cluster: ""},
		{UUID: "u", Addr: "h:0", Cluster: "c"},
		{UUID: "u", Addr: "h:99999", Cluster: "c"},
		{UUID: "u", Addr: ":22", Cluster: "c"},
		{UUID: "u", Addr: "h:1", Cluster: "c", Hostname: "a b"},
		{UUID: "u", Addr: "h:1", Cluster: "c", Labels: map[string]string{"": "x"}},
		{UUID: "u", Addr: "", Cluster: "c"},
		{UUID: "u", Addr: "h:1", Cluster: "c", Tunnel: true},
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

// TestNodeLabelsAndHostnameText is issue 10 item 11 at the store: every
// node record, however it is written (a remote heartbeat through auth or
// the all-in-one node straight to the store), is refused when a label or
// the hostname carries a control character or is out of bounds, with an
// error that names the label and prints the value escaped.
func TestNodeLabelsAndHostnameText(t *testing.T) {
	base := func() Node { return Node{UUID: "u1", Hostname: "web", Addr: "10.0.0.1:3022", Cluster: "c1"} }
	ok := base()
	ok.Labels = map[string]string{"env": "prod", "team/app": "shop-1", "unicode": "café ☕", "empty": ""}
	require.NoError(t, ok.CheckAndSetDefaults())

	for _, tc := range []struct {
		name   string
		mutate func(n *Node)
		want   string
	}{
		{"ESC in a value", func(n *Node) { n.Labels = map[string]string{"env": "\x1b[31mprod"} }, `node "u1": label "env": value "\x1b[31mprod" contains the control character U+001B`},
		{"LF in a value", func(n *Node) { n.Labels = map[string]string{"env": "a\nb"} }, `U+000A`},
		{"CR in a key", func(n *Node) { n.Labels = map[string]string{"e\rnv": "x"} }, `label key "e\rnv" contains the control character U+000D`},
		{"NUL", func(n *Node) { n.Labels = map[string]string{"env": "a\x00"} }, `U+0000`},
		{"DEL", func(n *Node) { n.Labels = map[string]string{"env": "a\x7f"} }, `U+007F`},
		{"C1 CSI", func(n *Node) { n.Labels = map[string]string{"env": "a\u009b2J"} }, `U+009B`},
		{"bidi override", func(n *Node) { n.Labels = map[string]string{"env": "\u202egnp.exe"} }, `U+202E`},
		{"zero width joiner", func(n *Node) { n.Labels = map[string]string{"env": "a\u200db"} }, `U+200D`},
		{"line separator", func(n *Node) { n.Labels = map[string]string{"env": "a\u2028b"} }, `U+2028`},
		{"invalid UTF-8", func(n *Node) { n.Labels = map[string]string{"env": "a\xffb"} }, `not valid UTF-8`},
		{"empty key", func(n *Node) { n.Labels = map[string]string{"": "x"} }, `empty label key`},
		{"long key", func(n *Node) { n.Labels = map[string]string{strings.Repeat("k", MaxLabelKeyLen+1): "x"} }, `longer than 253 bytes`},
		{"long value", func(n *Node) { n.Labels = map[string]string{"env": strings.Repeat("v", MaxLabelValueLen+1)} }, `label "env": value`},
		{"too many", func(n *Node) {
			n.Labels = map[string]string{}
			for i := range MaxNodeLabels + 1 {
				n.Labels[strings.Repeat("k", i+1)] = "v"
			}
		}, `65 labels, at most 64`},
		{"ESC in the hostname", func(n *Node) { n.Hostname = "web\x1b]0;x\x07" }, `node hostname "web\x1b]0;x\a"`},
		{"bidi in the hostname", func(n *Node) { n.Hostname = "web\u202e" }, `U+202E`},
		{"long hostname", func(n *Node) { n.Hostname = strings.Repeat("h", maxNameLen+1) }, `longer than 253`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := base()
			tc.mutate(&n)
			err := n.CheckAndSetDefaults()
			require.True(t, trace.IsBadParameter(err), "%v", err)
			require.ErrorContains(t, err, tc.want)
			// The message itself is safe to print: no raw control bytes.
			for _, r := range err.Error() {
				require.False(t, r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0), "raw control character %U in %q", r, err.Error())
			}
		})
	}
}

// TestHostnameShape is issue 10 item 5 as a table: the hostnames no node
// may take at join or heartbeat, for a list of known clusters.
func TestHostnameShape(t *testing.T) {
	const own = "0b6a8a8e-9f0c-4c4e-9a55-0d7b1f0c1a2b"
	clusters := []string{"prod.example", "leaf"}
	for _, tc := range []struct {
		hostname, addr string
		want           string // "" = allowed
	}{
		{"web1", "10.0.0.1:3022", ""},
		{"Web-Upper_2.internal", "10.0.0.1:3022", ""},
		{"web1.example", "10.0.0.1:3022", ""},
		{own, "10.0.0.1:3022", ""},
		{strings.ToUpper(own), "10.0.0.1:3022", ""},
		{"10.0.0.1", "10.0.0.1:3022", ""},
		{"2001:db8::1", "[2001:db8::1]:3022", ""},
		{"::ffff:10.0.0.1", "10.0.0.1:3022", ""},
		{"web1.prod.example", "", `"web1.prod.example" ends in .prod.example`},
		{"WEB1.Prod.Example", "", `ends in .prod.example`},
		{"web1.leaf", "", `ends in .leaf`},
		{"LEAF", "", `is the name of cluster "leaf"`},
		{"00000000-0000-4000-8000-000000000001", "", "is a UUID that is not this node's UUID"},
		{"{00000000-0000-4000-8000-000000000001}", "", `must start with a letter or a digit`},
		{"urn:uuid:00000000-0000-4000-8000-000000000001", "", `contains ':'`},
		{"00000000000040008000000000000001", "", "is a UUID"},
		{"10.0.0.2", "10.0.0.1:3022", `"10.0.0.2" is an IP address that is not this node's address "10.0.0.1:3022"`},
		{"10.0.0.1", "", "is an IP address that is not this node's address"},
		{"2001:db8::2", "[2001:db8::1]:3022", "is an IP address"},
		{"*", "", `contains '*'`},
		{"web?", "", `contains '?'`},
		{"a,b", "", `contains ','`},
		{"!web", "", `contains '!'`},
		{"[web]", "", `contains '['`},
		{"web:22", "", `contains ':'`},
		{"alice@web", "", `contains '@'`},
		{"web/1", "", `contains '/'`},
		{"-web", "", `must start with`},
		{"web..x", "", "empty DNS label"},
		{"web.", "", "empty DNS label"},
		{"café", "", `contains 'é'`},
		{"localhost", "", "names the local machine"},
		{"x.LOCALHOST", "", "names the local machine"},
		{"web\x1b[0m", "", "U+001B"},
		{"", "", "empty"},
	} {
		err := CheckHostnameShape(tc.hostname, own, tc.addr, clusters)
		if tc.want == "" {
			require.NoError(t, err, tc.hostname)
			continue
		}
		require.True(t, trace.IsBadParameter(err), "%q: %v", tc.hostname, err)
		require.ErrorContains(t, err, tc.want, tc.hostname)
	}
	// With no known clusters only the cluster rules go away.
	require.NoError(t, CheckHostnameShape("web1.prod.example", own, "", nil))
	require.Error(t, CheckHostnameShape("*", own, "", nil))
}
