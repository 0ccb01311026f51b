package srv

import (
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

func TestIsUserAuthority(t *testing.T) {
	ca, other := srvtest.NewCA(t), srvtest.NewCA(t)
	res := ca.CertAuthority("c", services.UserCA)
	res.SSHPublicKeys = append([]string{"garbage"}, res.SSHPublicKeys...)
	require.True(t, isUserAuthority(res, ca.Signer.PublicKey()))
	require.False(t, isUserAuthority(res, other.Signer.PublicKey()))
	require.False(t, isUserAuthority(nil, ca.Signer.PublicKey()))
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
