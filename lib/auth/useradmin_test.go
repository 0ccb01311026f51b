package auth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// TestDeleteRoleRefusesWhatIsReliedOn: the presets, a role users hold
// (named) and one a trusted_cluster maps to are refused, over the API as
// pctl calls it; once nobody relies on the role it goes.
func TestDeleteRoleRefusesWhatIsReliedOn(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	clt := env.adminClient(t)
	dev := &services.Role{Metadata: services.Metadata{Name: "dev"}, Spec: services.RoleSpec{Logins: []string{"x"}}}
	require.NoError(t, clt.UpsertRole(ctx, dev))

	for _, preset := range []string{services.PresetAccessRole, services.PresetAdminRole} {
		err := clt.DeleteRole(ctx, preset)
		requireKind(t, err, trace.IsBadParameter, "preset role")
	}
	_, err := clt.CreateUser(ctx, "zed", []byte("password123"), []string{"zed"}, []string{"dev"}, false)
	require.NoError(t, err)
	_, err = clt.CreateUser(ctx, "amy", []byte("password123"), []string{"amy"}, []string{"access", "dev"}, false)
	require.NoError(t, err)
	err = clt.DeleteRole(ctx, "dev")
	requireKind(t, err, trace.IsBadParameter, `still assigned to 2 user(s): "amy", "zed"`)

	_, err = clt.UpdateUser(ctx, "zed", []string{"access"}, nil)
	require.NoError(t, err)
	_, err = clt.UpdateUser(ctx, "amy", []string{"access"}, nil)
	require.NoError(t, err)
	tc := &services.TrustedCluster{
		Metadata: services.Metadata{Name: "root"},
		Spec: services.TrustedClusterSpec{ProxyAddr: "root.example:3080", Token: "abc@sha256:" + strings.Repeat("ab", 32),
			RoleMap: services.RoleMap{{Remote: "*", Local: []string{"dev"}}}},
	}
	require.NoError(t, env.store.UpsertTrustedCluster(ctx, tc))
	err = clt.DeleteRole(ctx, "dev")
	requireKind(t, err, trace.IsBadParameter, `role_map of trusted_cluster "root"`)
	require.NoError(t, env.store.DeleteTrustedCluster(ctx, "root"))

	require.NoError(t, clt.DeleteRole(ctx, "dev"))
	_, err = env.store.GetRole(ctx, "dev")
	require.True(t, trace.IsNotFound(err))
	requireKind(t, clt.DeleteRole(ctx, "dev"), trace.IsNotFound, `role "dev" not found`)
}

// TestUpdateUserAndResetPassword: an update replaces only what it is
// given and keeps the password; a reset changes the password and ends the
// user's web sessions, and nobody else's.
func TestUpdateUserAndResetPassword(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	clt := env.adminClient(t)
	for _, u := range []string{"ann", "ben"} {
		_, err := clt.CreateUser(ctx, u, []byte("old password"), []string{u}, nil, false)
		require.NoError(t, err)
	}
	u, err := clt.UpdateUser(ctx, "ann", nil, []string{"ann", "deploy"})
	require.NoError(t, err)
	require.Equal(t, []string{services.PresetAccessRole}, u.Roles)
	require.Equal(t, []string{"ann", "deploy"}, u.Traits[services.TraitLogins])
	require.Empty(t, u.PasswordHash, "no hash over the API")
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "ann", Password: "old password"})
	require.NoError(t, err, "an update keeps the password")
	requireKind(t, func() error { _, err := clt.UpdateUser(ctx, "nobody", []string{"access"}, nil); return err }(), trace.IsNotFound, `user "nobody" not found`)
	requireKind(t, func() error { _, err := clt.UpdateUser(ctx, "ann", []string{"nosuch"}, nil); return err }(), trace.IsNotFound, `role "nosuch" does not exist`)
	requireKind(t, func() error { _, err := clt.UpdateUser(ctx, "ann", nil, []string{"bad login"}); return err }(), trace.IsBadParameter, "login")

	session := func(user string, i int) string {
		key := webSessionKeyOf(fmt.Sprintf("%s-%d", user, i))
		th := sha256.Sum256([]byte("token"))
		require.NoError(t, env.store.CreateWebSession(ctx, key, services.WebSession{User: user, TokenHash: th[:], Expires: env.clock.Now().Add(time.Hour)}))
		return key
	}
	annKeys := []string{session("ann", 1), session("ann", 2)}
	benKey := session("ben", 1)

	ended, err := clt.ResetPassword(ctx, "ann", []byte("new password"))
	require.NoError(t, err)
	require.Equal(t, 2, ended)
	for _, k := range annKeys {
		_, err := env.store.GetWebSession(ctx, k)
		require.True(t, trace.IsNotFound(err), "ann's session %s ended", k[:8])
	}
	_, err = env.store.GetWebSession(ctx, benKey)
	require.NoError(t, err, "ben's session is not touched")
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "ann", Password: "old password"})
	require.True(t, trace.IsAccessDenied(err), "the old password is refused: %v", err)
	_, err = env.auth.AuthenticateUser(ctx, authapi.AuthRequest{User: "ann", Password: "new password"})
	require.NoError(t, err)
	u, err = env.store.GetUser(ctx, "ann")
	require.NoError(t, err)
	require.Equal(t, []string{"ann", "deploy"}, u.Traits[services.TraitLogins], "a reset keeps roles and logins")
	_, err = clt.ResetPassword(ctx, "nobody", []byte("new password"))
	requireKind(t, err, trace.IsNotFound, `user "nobody" not found`)
}
