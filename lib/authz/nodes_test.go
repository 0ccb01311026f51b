package authz

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/services"
)

type staticNodes []services.Node

func (s staticNodes) GetNodes(_ context.Context, cluster string) ([]services.Node, error) {
	var out []services.Node
	for _, n := range s {
		if cluster == "" || n.Cluster == cluster {
			out = append(out, n)
		}
	}
	return out, nil
}

// TestListNodesFiltersByRBAC: `psh ls` shows only nodes one of the
// certificate's logins may reach, with exactly those logins.
func TestListNodesFiltersByRBAC(t *testing.T) {
	dev := &services.Role{Metadata: services.Metadata{Name: "dev"}, Spec: services.RoleSpec{
		Logins:     []string{"dev"},
		NodeLabels: map[string]services.LabelValues{"env": {"dev"}},
	}}
	ops := &services.Role{Metadata: services.Metadata{Name: "ops"}, Spec: services.RoleSpec{
		Logins:     []string{"root"},
		NodeLabels: map[string]services.LabelValues{"env": {"prod"}},
	}}
	for _, r := range []*services.Role{dev, ops} {
		require.NoError(t, r.CheckAndSetDefaults())
	}
	nodes := staticNodes{
		{UUID: "u3", Hostname: "web", Addr: "10.0.0.3:3022", Cluster: "c1", Labels: map[string]string{"env": "prod"}},
		{UUID: "u1", Hostname: "app", Addr: "10.0.0.1:3022", Cluster: "c1", Labels: map[string]string{"env": "dev"}},
		{UUID: "u2", Hostname: "db", Addr: "10.0.0.2:3022", Cluster: "c1", Labels: map[string]string{"env": "secret"}},
		{UUID: "u4", Hostname: "app", Addr: "10.0.1.1:3022", Cluster: "other", Labels: map[string]string{"env": "dev"}},
		{UUID: "u5", Hostname: "nat", Tunnel: true, Cluster: "c1", Labels: map[string]string{"env": "dev"}},
		{UUID: "u6", Hostname: "old", Addr: "10.0.0.6:22", Cluster: "c1", Labels: map[string]string{"env": "dev"}, Kind: services.NodeKindOpenSSH},
		{UUID: "u7", Hostname: "sec", Addr: "10.0.0.7:22", Cluster: "c1", Labels: map[string]string{"env": "secret"}, Kind: services.NodeKindOpenSSH},
	}
	id := &Identity{
		User:    "alice",
		Cert:    &ssh.Certificate{ValidPrincipals: []string{"dev", "root"}},
		Checker: services.NewAccessChecker([]*services.Role{dev, ops}, nil),
	}
	got, err := ListNodes(context.Background(), nodes, id, "c1")
	require.NoError(t, err)
	require.Equal(t, []proxyapi.NodeEntry{
		{UUID: "u1", Hostname: "app", Addr: "10.0.0.1:3022", Cluster: "c1", Labels: map[string]string{"env": "dev"}, Logins: []string{"dev"}},
		{UUID: "u5", Hostname: "nat", Tunnel: true, Cluster: "c1", Labels: map[string]string{"env": "dev"}, Logins: []string{"dev"}},
		// An OpenSSH node says so (labels and RBAC as for any node: u7 is
		// not listed).
		{UUID: "u6", Hostname: "old", Addr: "10.0.0.6:22", Cluster: "c1", Labels: map[string]string{"env": "dev"}, Logins: []string{"dev"}, Kind: services.NodeKindOpenSSH},
		{UUID: "u3", Hostname: "web", Addr: "10.0.0.3:3022", Cluster: "c1", Labels: map[string]string{"env": "prod"}, Logins: []string{"root"}},
	}, got)

	// A certificate without the root login sees only the dev node.
	id.Cert = &ssh.Certificate{ValidPrincipals: []string{"dev"}}
	got, err = ListNodes(context.Background(), nodes, id, "c1")
	require.NoError(t, err)
	require.Len(t, got, 3)

	_, err = ListNodes(context.Background(), nodes, &Identity{}, "c1")
	require.Error(t, err)
}
