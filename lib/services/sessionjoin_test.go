package services

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func joinRole(name string, spec RoleSpec) *Role {
	return &Role{Kind: KindRole, Version: "v1", Metadata: Metadata{Name: name}, Spec: spec}
}

// TestCanJoinSessionDenyByDefault: no preset role may join anything; a
// join_sessions rule allows exactly its owner roles and modes.
func TestCanJoinSessionDenyByDefault(t *testing.T) {
	presets := PresetRoles()
	for _, r := range presets {
		require.NoError(t, r.CheckAndSetDefaults())
	}
	all := NewAccessChecker(presets, nil)
	for _, m := range SessionModes {
		require.False(t, all.CanJoinSession([]string{PresetAccessRole}, m), m)
	}
	require.False(t, all.CanJoinSessionAnyMode([]string{PresetAccessRole, PresetAdminRole}))

	aud := joinRole("auditor", RoleSpec{JoinSessions: []SessionJoinRule{{Roles: []string{"access"}, Modes: []string{"observer", "moderator"}}}})
	require.NoError(t, aud.CheckAndSetDefaults())
	c := NewAccessChecker([]*Role{aud}, nil)
	require.True(t, c.CanJoinSession([]string{"access"}, SessionModeObserver))
	require.True(t, c.CanJoinSession([]string{"dev", "access"}, SessionModeModerator))
	require.False(t, c.CanJoinSession([]string{"access"}, SessionModePeer))
	require.False(t, c.CanJoinSession([]string{"admin"}, SessionModeObserver))
	require.False(t, c.CanJoinSession(nil, SessionModeObserver))
	require.True(t, c.CanJoinSessionAnyMode([]string{"access"}))
}

// TestSessionJoinValidation: a bad rule is refused with the field named;
// require_session_join gets its defaults.
func TestSessionJoinValidation(t *testing.T) {
	for _, tc := range []struct {
		spec RoleSpec
		want string
	}{
		{RoleSpec{JoinSessions: []SessionJoinRule{{Modes: []string{"observer"}}}}, "spec.join_sessions[0].roles is empty"},
		{RoleSpec{JoinSessions: []SessionJoinRule{{Roles: []string{"a"}, Modes: []string{"admin"}}}}, `spec.join_sessions[0].modes: unknown mode "admin"`},
		{RoleSpec{JoinSessions: []SessionJoinRule{{Roles: []string{"a"}}}}, "spec.join_sessions[0].modes: empty"},
		{RoleSpec{RequireSessionJoin: []SessionRequireRule{{Roles: []string{"a"}, Modes: []string{"observer"}}}}, "observers never count"},
		{RoleSpec{RequireSessionJoin: []SessionRequireRule{{Roles: []string{"a"}, Modes: []string{"moderator"}, OnLeave: "wait"}}}, `on_leave: unknown value "wait"`},
		{RoleSpec{RequireSessionJoin: []SessionRequireRule{{Roles: []string{"a"}, Modes: []string{"moderator"}, Count: -1}}}, "count must not be negative"},
	} {
		err := joinRole("r", tc.spec).CheckAndSetDefaults()
		require.ErrorContains(t, err, tc.want)
	}
	r := joinRole("r", RoleSpec{RequireSessionJoin: []SessionRequireRule{{Roles: []string{"auditor"}, Modes: []string{"moderator"}}}})
	require.NoError(t, r.CheckAndSetDefaults())
	q := NewAccessChecker([]*Role{r}, nil).SessionRequirements()
	require.Equal(t, []SessionRequireRule{{Roles: []string{"auditor"}, Modes: []string{"moderator"}, Count: 1, OnLeave: OnLeaveTerminate}}, q)
	require.True(t, q[0].Counts([]string{"auditor"}, SessionModeModerator))
	require.False(t, q[0].Counts([]string{"auditor"}, SessionModeObserver))
	require.False(t, q[0].Counts([]string{"access"}, SessionModeModerator))
}
