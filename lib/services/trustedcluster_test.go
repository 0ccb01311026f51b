package services

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRoleMapMap(t *testing.T) {
	for _, tc := range []struct {
		name         string
		m            RoleMap
		remote       []string
		wantLocal    []string
		wantUnmapped []string
	}{
		{
			name:      "exact",
			m:         RoleMap{{Remote: "access", Local: []string{"dev"}}},
			remote:    []string{"access"},
			wantLocal: []string{"dev"},
		},
		{
			name:         "exact does not match a longer name",
			m:            RoleMap{{Remote: "access", Local: []string{"dev"}}},
			remote:       []string{"access-admin"},
			wantUnmapped: []string{"access-admin"},
		},
		{
			name:      "star matches every role",
			m:         RoleMap{{Remote: "*", Local: []string{"guest"}}},
			remote:    []string{"access", "admin"},
			wantLocal: []string{"guest"},
		},
		{
			name:         "prefix glob",
			m:            RoleMap{{Remote: "dev-*", Local: []string{"dev"}}},
			remote:       []string{"dev-eu", "dev-", "ops"},
			wantLocal:    []string{"dev"},
			wantUnmapped: []string{"ops"},
		},
		{
			name:         "dot is literal, not any character",
			m:            RoleMap{{Remote: "a.b*", Local: []string{"x"}}},
			remote:       []string{"axb", "a.bc"},
			wantLocal:    []string{"x"},
			wantUnmapped: []string{"axb"},
		},
		{
			name: "every matching entry contributes, sorted and deduplicated",
			m: RoleMap{
				{Remote: "access", Local: []string{"dev", "audit"}},
				{Remote: "*", Local: []string{"dev"}},
			},
			remote:    []string{"access"},
			wantLocal: []string{"audit", "dev"},
		},
		{
			name:         "nothing matches",
			m:            RoleMap{{Remote: "admin", Local: []string{"admin"}}},
			remote:       []string{"access", "auditor"},
			wantUnmapped: []string{"access", "auditor"},
		},
		{
			name: "no remote roles maps to nothing",
			m:    RoleMap{{Remote: "*", Local: []string{"guest"}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local, unmapped := tc.m.Map(tc.remote)
			require.Equal(t, tc.wantLocal, local)
			require.Equal(t, tc.wantUnmapped, unmapped)
		})
	}
}

func TestTrustedClusterCheck(t *testing.T) {
	valid := func() TrustedCluster {
		return TrustedCluster{
			Metadata: Metadata{Name: "root"},
			Spec: TrustedClusterSpec{
				Enabled:   true,
				ProxyAddr: "root.example.com:3080",
				Token:     "abc",
				RoleMap:   RoleMap{{Remote: "access", Local: []string{"dev"}}},
			},
		}
	}
	tc := valid()
	require.NoError(t, tc.CheckAndSetDefaults())
	require.Equal(t, KindTrustedCluster, tc.Kind)
	require.Equal(t, V1, tc.Version)

	for _, bad := range []struct {
		name   string
		mutate func(*TrustedCluster)
		want   string
	}{
		{"wrong kind", func(tc *TrustedCluster) { tc.Kind = "role" }, `kind "role"`},
		{"bad name", func(tc *TrustedCluster) { tc.Metadata.Name = "a/b" }, "metadata.name"},
		{"no port", func(tc *TrustedCluster) { tc.Spec.ProxyAddr = "root.example.com" }, "spec.proxy_addr"},
		{"no token", func(tc *TrustedCluster) { tc.Spec.Token = "" }, "spec.token is empty"},
		{"empty role map", func(tc *TrustedCluster) { tc.Spec.RoleMap = nil }, "role_map is empty"},
		{"empty remote", func(tc *TrustedCluster) { tc.Spec.RoleMap[0].Remote = "" }, "role_map[0]: remote is empty"},
		{"bad remote", func(tc *TrustedCluster) { tc.Spec.RoleMap[0].Remote = "a b*" }, "role_map[0]: remote"},
		{"empty local", func(tc *TrustedCluster) { tc.Spec.RoleMap[0].Local = nil }, `role_map[0] (remote "access"): local is empty`},
		{"bad local", func(tc *TrustedCluster) { tc.Spec.RoleMap[0].Local = []string{"-x"} }, "local: role name"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			tc := valid()
			bad.mutate(&tc)
			err := tc.CheckAndSetDefaults()
			require.Error(t, err)
			require.Contains(t, err.Error(), bad.want)
		})
	}
}
