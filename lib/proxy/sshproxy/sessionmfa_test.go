package sshproxy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/services"
)

// TestCheckSessionMFA: the proxy's decision for a node, per certificate:
// a per-session certificate reaches only the node and cluster it was
// issued for (an attacker who copied one gets nothing elsewhere); a
// normal one reaches only nodes no require_session_mfa role reaches.
func TestCheckSessionMFA(t *testing.T) {
	strict := &services.Role{Metadata: services.Metadata{Name: "strict"}, Spec: services.RoleSpec{
		Logins: []string{"root"}, NodeLabels: map[string]services.LabelValues{"env": {"prod"}}, RequireSessionMFA: true,
	}}
	relaxed := &services.Role{Metadata: services.Metadata{Name: "relaxed"}, Spec: services.RoleSpec{
		Logins: []string{"root"}, NodeLabels: map[string]services.LabelValues{"env": {"dev"}},
	}}
	prod := services.Node{UUID: "uuid-prod", Hostname: "db", Labels: map[string]string{"env": "prod"}}
	prod2 := services.Node{UUID: "uuid-prod-2", Hostname: "db2", Labels: map[string]string{"env": "prod"}}
	dev := services.Node{UUID: "uuid-dev", Hostname: "web", Labels: map[string]string{"env": "dev"}}
	perSession := func(cluster, node string) *ssh.Certificate {
		data, err := json.Marshal(services.SessionMFATarget{Cluster: cluster, Node: node, Login: "root"})
		require.NoError(t, err)
		return &ssh.Certificate{Permissions: ssh.Permissions{Extensions: map[string]string{services.CertExtensionSessionMFA: string(data)}}}
	}
	normal := &ssh.Certificate{Permissions: ssh.Permissions{Extensions: map[string]string{}}}
	checker := services.NewAccessChecker([]*services.Role{strict, relaxed}, nil)
	for _, tc := range []struct {
		name string
		cert *ssh.Certificate
		node services.Node
		ok   bool
		msg  string
	}{
		{"normal cert, node needs no MFA", normal, dev, true, ""},
		{"normal cert, node needs MFA", normal, prod, false, "require_session_mfa"},
		{"per-session cert, its node", perSession("c1", "uuid-prod"), prod, true, ""},
		{"per-session cert, another node", perSession("c1", "uuid-prod"), prod2, false, "another node"},
		{"per-session cert, another node without MFA", perSession("c1", "uuid-prod"), dev, false, "another node"},
		{"per-session cert, another cluster", perSession("c2", "uuid-prod"), prod, false, "another node"},
		{"malformed per-session cert", &ssh.Certificate{Permissions: ssh.Permissions{Extensions: map[string]string{services.CertExtensionSessionMFA: "{"}}}, prod, false, "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := &authz.Identity{User: "alice", Cert: tc.cert, Checker: checker}
			err := id.CheckSessionMFA(&tc.node, "c1")
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.msg)
		})
	}
}
