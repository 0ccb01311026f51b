package web

import (
	"context"
	"errors"

	"github.com/gravitational/trace"
)

// Register-only sessions, the proxy's half (lib/auth/registeronly.go has
// the policy): a user who proved their password but has no second factor
// while auth_preference requires one gets a session that may list and
// register second factors and log out (requireAnySession), nothing else.
// It has no key or certificate (auth certifies none), so nothing here
// could reach a node with it even if a route forgot to refuse it: every
// other route, the terminal included, refuses it first (authenticate).
// Registering ends it; the user logs in again with the new factor.

// errRegisterOnly refuses every other call of a register-only session:
// 403 with what to do.
var errRegisterOnly = errors.New("this session can only register a second factor: add a passkey on the Account page, then log in again with it")

// adoptRegisterOnly serves a register-only session this proxy did not
// create (another proxy's login, or before a restart): there is nothing
// to certify, only the record to trust.
func (s *Server) adoptRegisterOnly(ref SessionRef, rec *SessionRecord) *liveSession {
	live := &liveSession{user: rec.User, registerOnly: true, expires: rec.Expires}
	live.setRef(ref)
	live.ctx, live.cancel = context.WithCancelCause(s.web.ctx)
	if got := s.web.sessions.addIfAbsent(live); got != live {
		live.cancel(errLoggedOut)
		return got
	}
	s.cfg.Logger.WithField("user", live.user).Info("Serving a register-only web session created on another proxy.")
	return live
}

// endRegisterOnly ends a register-only session once its factor is
// registered (auth has deleted the record too).
func (s *Server) endRegisterOnly(ctx context.Context, live *liveSession) {
	if err := s.cfg.WebSessions.Store.DeleteSession(ctx, live.ref); err != nil && !trace.IsNotFound(err) {
		s.cfg.Logger.WithError(err).Warn("Could not delete a register-only web session.")
	}
	s.web.sessions.remove(live.key)
}
