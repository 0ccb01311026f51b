package services

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

var testPin = "sha256:" + strings.Repeat("ab", 32)

func TestParseTrustedClusterToken(t *testing.T) {
	secret, pin, err := ParseTrustedClusterToken(TrustedClusterToken("0123abcd", "sha256:"+strings.Repeat("AB", 32)))
	require.NoError(t, err)
	require.Equal(t, "0123abcd", secret)
	require.Equal(t, testPin, pin, "pins compare lower-case")
	for _, bad := range []string{"", "abc", "abc@", "@" + testPin, "a/b@" + testPin, "abc@" + testPin + "00"} {
		_, _, err := ParseTrustedClusterToken(bad)
		require.Error(t, err, bad)
		require.True(t, trace.IsBadParameter(err), bad)
	}
}

func TestStoreTrustedAndRemoteClusters(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, clockwork.NewFakeClock())

	tc := &TrustedCluster{Metadata: Metadata{Name: "root"}, Spec: TrustedClusterSpec{
		Enabled: true, ProxyAddr: "root:3080", Token: "abc@" + testPin,
		RoleMap: RoleMap{{Remote: "access", Local: []string{"dev"}}},
	}}
	require.NoError(t, s.UpsertTrustedCluster(ctx, tc))
	got, err := s.GetTrustedCluster(ctx, "root")
	require.NoError(t, err)
	require.Equal(t, tc, got)
	all, err := s.GetTrustedClusters(ctx)
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Error(t, s.UpsertTrustedCluster(ctx, &TrustedCluster{Metadata: Metadata{Name: "bad"}}))
	require.NoError(t, s.DeleteTrustedCluster(ctx, "root"))
	_, err = s.GetTrustedCluster(ctx, "root")
	require.True(t, trace.IsNotFound(err))
	require.True(t, trace.IsNotFound(s.DeleteTrustedCluster(ctx, "root")))
	require.True(t, trace.IsNotFound(s.DeleteTrustedCluster(ctx, "../x")))

	rc := RemoteCluster{Name: "leaf", Created: time.Unix(100, 0).UTC()}
	require.NoError(t, s.CreateRemoteCluster(ctx, rc))
	err = s.CreateRemoteCluster(ctx, rc)
	require.True(t, trace.IsAlreadyExists(err))
	require.ErrorContains(t, err, `cluster "leaf" is already a leaf`)
	gotRC, err := s.GetRemoteCluster(ctx, "leaf")
	require.NoError(t, err)
	require.Equal(t, rc, *gotRC)
	rcs, err := s.GetRemoteClusters(ctx)
	require.NoError(t, err)
	require.Equal(t, []RemoteCluster{rc}, rcs)
	require.NoError(t, s.DeleteRemoteCluster(ctx, "leaf"))
	require.True(t, trace.IsNotFound(s.DeleteRemoteCluster(ctx, "leaf")))
	require.Error(t, s.CreateRemoteCluster(ctx, RemoteCluster{Name: "a/b"}))
}

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
				Token:     "abc@" + testPin,
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
		{"token without its pin", func(tc *TrustedCluster) { tc.Spec.Token = "abc" }, "SECRET@sha256:HEX"},
		{"token with a short pin", func(tc *TrustedCluster) { tc.Spec.Token = "abc@sha256:00" }, "64 hex digits"},
		{"token with a pin of another hash", func(tc *TrustedCluster) { tc.Spec.Token = "abc@md5:" + testPin[7:] }, "64 hex digits"},
		{"token with an empty secret", func(tc *TrustedCluster) { tc.Spec.Token = "@" + testPin }, "SECRET@sha256:HEX"},
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

func TestRemoteClusterStatus(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := newTestStore(t, clock)
	require.NoError(t, s.CreateRemoteCluster(ctx, RemoteCluster{Name: "leaf", Created: clock.Now()}))
	rc, err := s.GetRemoteCluster(ctx, "leaf")
	require.NoError(t, err)
	require.Equal(t, RemoteClusterOffline, rc.Status(clock.Now()), "never connected")

	require.NoError(t, s.TouchRemoteCluster(ctx, "leaf", clock.Now()))
	rc, err = s.GetRemoteCluster(ctx, "leaf")
	require.NoError(t, err)
	require.Equal(t, clock.Now().UTC(), rc.LastConnected)
	require.Equal(t, RemoteClusterOnline, rc.Status(clock.Now()))
	require.Equal(t, RemoteClusterOnline, rc.Status(clock.Now().Add(RemoteClusterOfflineAfter-time.Second)))
	require.Equal(t, RemoteClusterOffline, rc.Status(clock.Now().Add(RemoteClusterOfflineAfter)))

	// A report never creates a record: a removed leaf stays removed.
	require.NoError(t, s.DeleteRemoteCluster(ctx, "leaf"))
	require.True(t, trace.IsNotFound(s.TouchRemoteCluster(ctx, "leaf", clock.Now())))
	_, err = s.GetRemoteCluster(ctx, "leaf")
	require.True(t, trace.IsNotFound(err))
}
