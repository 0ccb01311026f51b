package services

import (
	"slices"

	"github.com/gravitational/trace"
)

// Session join modes: an observer watches, a peer may type, a moderator
// may type and end the session for everyone (and counts for
// require_session_join).
const (
	SessionModeObserver  = "observer"
	SessionModePeer      = "peer"
	SessionModeModerator = "moderator"
)

// SessionModes are the join modes a role may name.
var SessionModes = []string{SessionModeObserver, SessionModePeer, SessionModeModerator}

// What a session that requires moderators does when the last one leaves.
const (
	OnLeavePause     = "pause"
	OnLeaveTerminate = "terminate"
)

// SessionJoinRule lets the holder join the live sessions of users who
// hold one of Roles, in one of Modes. "*" in Roles is any role.
type SessionJoinRule struct {
	Roles []string `json:"roles"`
	Modes []string `json:"modes"`
}

// SessionRequireRule holds the holder's interactive sessions until Count
// parties holding one of Roles have joined in one of Modes (observers
// never count); OnLeave says what happens when they are no longer enough:
// "pause" (input is discarded until one is back) or "terminate" (the
// default: the session ends).
type SessionRequireRule struct {
	Roles   []string `json:"roles"`
	Modes   []string `json:"modes"`
	Count   int      `json:"count,omitempty"`
	OnLeave string   `json:"on_leave,omitempty"`
}

// checkSessionJoin validates a role's join_sessions and
// require_session_join, naming the bad entry.
func checkSessionJoin(r *Role) error {
	for i, j := range r.Spec.JoinSessions {
		if len(j.Roles) == 0 {
			return trace.BadParameter("role %q: spec.join_sessions[%d].roles is empty: name the roles whose sessions may be joined (or \"*\")", r.Metadata.Name, i)
		}
		if err := checkModes(j.Modes); err != nil {
			return trace.BadParameter("role %q: spec.join_sessions[%d].modes: %v", r.Metadata.Name, i, err)
		}
	}
	for i := range r.Spec.RequireSessionJoin {
		q := &r.Spec.RequireSessionJoin[i]
		if len(q.Roles) == 0 {
			return trace.BadParameter("role %q: spec.require_session_join[%d].roles is empty: name the roles that count as moderators", r.Metadata.Name, i)
		}
		if err := checkModes(q.Modes); err != nil {
			return trace.BadParameter("role %q: spec.require_session_join[%d].modes: %v", r.Metadata.Name, i, err)
		}
		if slices.Contains(q.Modes, SessionModeObserver) {
			return trace.BadParameter("role %q: spec.require_session_join[%d].modes: observers never count; name peer or moderator", r.Metadata.Name, i)
		}
		if q.Count < 0 {
			return trace.BadParameter("role %q: spec.require_session_join[%d].count must not be negative", r.Metadata.Name, i)
		}
		if q.Count == 0 {
			q.Count = 1
		}
		switch q.OnLeave {
		case "":
			q.OnLeave = OnLeaveTerminate
		case OnLeavePause, OnLeaveTerminate:
		default:
			return trace.BadParameter("role %q: spec.require_session_join[%d].on_leave: unknown value %q, want %q or %q", r.Metadata.Name, i, q.OnLeave, OnLeavePause, OnLeaveTerminate)
		}
	}
	return nil
}

func checkModes(modes []string) error {
	if len(modes) == 0 {
		return trace.BadParameter("empty: name observer, peer or moderator")
	}
	for _, m := range modes {
		if !slices.Contains(SessionModes, m) {
			return trace.BadParameter("unknown mode %q, want observer, peer or moderator", m)
		}
	}
	return nil
}

// CanJoinSession reports whether the holder may join, in mode, a live
// session of a user holding ownerRoles. Deny by default: no rule, no join.
func (a *AccessChecker) CanJoinSession(ownerRoles []string, mode string) bool {
	for _, r := range a.roles {
		for _, j := range r.Spec.JoinSessions {
			if slices.Contains(j.Modes, mode) && rolesMeet(j.Roles, ownerRoles) {
				return true
			}
		}
	}
	return false
}

// CanJoinSessionAnyMode reports whether the holder may join such a
// session at all: what a listing shows.
func (a *AccessChecker) CanJoinSessionAnyMode(ownerRoles []string) bool {
	for _, m := range SessionModes {
		if a.CanJoinSession(ownerRoles, m) {
			return true
		}
	}
	return false
}

// SessionRequirements are the require_session_join rules of the
// holder's roles, with their defaults filled in.
func (a *AccessChecker) SessionRequirements() []SessionRequireRule {
	var out []SessionRequireRule
	for _, r := range a.roles {
		for _, q := range r.Spec.RequireSessionJoin {
			if q.Count <= 0 {
				q.Count = 1
			}
			if q.OnLeave == "" {
				q.OnLeave = OnLeaveTerminate
			}
			out = append(out, q)
		}
	}
	return out
}

// Counts reports whether a party holding partyRoles in mode counts for q.
func (q SessionRequireRule) Counts(partyRoles []string, mode string) bool {
	return mode != SessionModeObserver && slices.Contains(q.Modes, mode) && rolesMeet(q.Roles, partyRoles)
}

// rolesMeet reports whether held includes one of want ("*": any).
func rolesMeet(want, held []string) bool {
	for _, w := range want {
		if w == "*" && len(held) > 0 {
			return true
		}
		if slices.Contains(held, w) {
			return true
		}
	}
	return false
}
