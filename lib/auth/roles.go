package auth

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// DeleteRole removes a role (`pctl rm role/NAME`), refusing what would
// break the cluster:
//
//   - the presets, access and admin: the auth server writes an absent
//     preset back at its defaults on its next start (initRoles), so a
//     removal would not last and could restore, at a restart, grants the
//     operator meant to take away; access is also the default role of
//     `pctl users add`. A preset is narrowed by editing it (pctl create -f).
//   - a role still assigned to users: they would keep the name in their
//     record and lose its grants silently at their next login. The error
//     names them, so the admin moves them off first (pctl users update).
//   - a role a trusted_cluster maps the root's users to, for the same
//     reason, seen from the root's side.
//
// A user given the role between the check and the removal keeps a name
// that grants nothing, as with a role removed before this check existed;
// the check is for the admin's mistakes, not a lock.
func (s *Server) DeleteRole(ctx context.Context, name string) error {
	if name == services.PresetAccessRole || name == services.PresetAdminRole {
		return trace.BadParameter("role %q is a preset role and cannot be removed: the auth server recreates it at its defaults on start; narrow it with pctl create -f instead", name)
	}
	if _, err := s.store.GetRole(ctx, name); err != nil {
		if trace.IsNotFound(err) {
			return trace.NotFound("role %q not found", name)
		}
		return trace.Wrap(err)
	}
	users, err := s.store.GetUsers(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	var holders []string
	for _, u := range users {
		if slices.Contains(u.Roles, name) {
			holders = append(holders, u.Name)
		}
	}
	if len(holders) > 0 {
		slices.Sort(holders)
		return trace.BadParameter("role %q is still assigned to %d user(s): %s; change their roles first (pctl users update NAME --roles ...)",
			name, len(holders), quoteList(holders))
	}
	tcs, err := s.store.GetTrustedClusters(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	var mappers []string
	for _, tc := range tcs {
		for _, m := range tc.Spec.RoleMap {
			if slices.Contains(m.Local, name) {
				mappers = append(mappers, tc.Metadata.Name)
				break
			}
		}
	}
	if len(mappers) > 0 {
		slices.Sort(mappers)
		return trace.BadParameter("role %q is in the role_map of trusted_cluster %s; change it first (pctl create -f)", name, quoteList(mappers))
	}
	if err := s.store.DeleteRole(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	s.log.WithField("role", name).Info("Removed role.")
	return nil
}

// quoteList quotes each name (they are user-chosen: an error message must
// not carry raw control characters) and joins them.
func quoteList(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = strconv.Quote(n)
	}
	return strings.Join(out, ", ")
}
