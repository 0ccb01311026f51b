package events

// Events of shared and moderated sessions, emitted by the node that holds
// the session.
const (
	// SessionJoin: a party joined a live session (session_id, mode,
	// session_user: the owner).
	SessionJoin = "session.join"
	// SessionLeave: a party left it (same fields).
	SessionLeave = "session.leave"
	// SessionModeration: a moderated session changed state (session_id,
	// state: waiting, started, paused, resumed, terminated; reason).
	SessionModeration = "session.moderation"
)
