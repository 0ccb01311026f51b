package auth

import (
	"context"
	"errors"
	"slices"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/services"
)

// UpdateUser replaces the roles and/or the logins trait of an existing
// user (`pctl users update`); a nil list is left unchanged. Like a role
// edit, it takes effect at the user's next login: certificates already
// issued carry the roles and logins they were signed with until they
// expire (a lock cuts them at once).
func (s *Server) UpdateUser(ctx context.Context, name string, roles, logins []string) (*services.User, error) {
	if roles == nil && logins == nil {
		return nil, trace.BadParameter("update user %q: nothing to change (give roles or logins)", name)
	}
	if roles != nil {
		if len(roles) == 0 {
			return nil, trace.BadParameter("update user %q: a user needs at least one role", name)
		}
		for _, r := range roles {
			if _, err := s.store.GetRole(ctx, r); err != nil {
				if trace.IsNotFound(err) {
					return nil, trace.NotFound("role %q does not exist", r)
				}
				return nil, trace.Wrap(err)
			}
		}
	}
	for _, l := range logins {
		if err := services.CheckLogin(l); err != nil {
			return nil, trace.Wrap(err)
		}
	}
	user, err := s.getUser(ctx, name)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if roles != nil {
		user.Roles = slices.Clone(roles)
	}
	if logins != nil {
		if user.Traits == nil {
			user.Traits = map[string][]string{}
		}
		user.Traits[services.TraitLogins] = slices.Clone(logins)
	}
	if err := s.store.UpsertUser(ctx, *user); err != nil {
		return nil, trace.Wrap(err)
	}
	s.log.WithFields(map[string]any{"user": name, "roles": user.Roles, "logins": user.Traits[services.TraitLogins]}).Info("Updated user.")
	pub := publicUser(*user)
	return &pub, nil
}

// ResetPassword sets a user's password (`pctl users reset-password`) and
// ends the user's web sessions, on every proxy. A reset is what an admin
// does when the password may be known to someone else: a browser session
// opened with it must not outlive it (Teleport's reset does the same).
// SSH certificates already issued are not revocable by a reset: they run
// to their expiry, as Teleport's do; `pctl lock --user` cuts those.
// The user's OTP enrolment is kept.
func (s *Server) ResetPassword(ctx context.Context, name string, password []byte) (int, error) {
	if len(password) == 0 {
		return 0, trace.BadParameter("missing password for user %q", name)
	}
	user, err := s.getUser(ctx, name)
	if err != nil {
		return 0, trace.Wrap(err)
	}
	hash, err := bcrypt.GenerateFromPassword(password, s.cfg.BcryptCost)
	if errors.Is(err, bcrypt.ErrPasswordTooLong) {
		return 0, trace.BadParameter("password is too long: at most 72 bytes")
	}
	if err != nil {
		return 0, trace.Wrap(err)
	}
	user.PasswordHash = hash
	if err := s.store.UpsertUser(ctx, *user); err != nil {
		return 0, trace.Wrap(err)
	}
	ended, err := s.store.DeleteUserWebSessions(ctx, name)
	if err != nil {
		return ended, trace.Wrap(err, "password of %q reset, but ending its web sessions failed", name)
	}
	s.log.WithFields(map[string]any{"user": name, "web_sessions_ended": ended}).Info("Reset user password.")
	return ended, nil
}

// getUser reads a user for an admin change, with the error the admin
// should see for a name that does not exist.
func (s *Server) getUser(ctx context.Context, name string) (*services.User, error) {
	if err := services.CheckUserName(name); err != nil {
		return nil, trace.Wrap(err)
	}
	user, err := s.store.GetUser(ctx, name)
	if trace.IsNotFound(err) {
		return nil, trace.NotFound("user %q not found (see pctl users ls)", name)
	}
	return user, trace.Wrap(err)
}
