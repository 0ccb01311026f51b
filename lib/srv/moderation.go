package srv

import (
	"fmt"
	"io"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/party"
)

// moderationRules are the owner's require_session_join rules for spec.
// A shell or command the rules hold must have a pty: only a terminal can
// be watched, so a held user's exec without one is refused (deny by
// default) rather than run unwatched.
func (s *session) moderationRules(spec procSpec) ([]party.Requirement, error) {
	if s.c.auth.id.Checker == nil || s.c.srv.parties == nil {
		return nil, nil
	}
	var rules []party.Requirement
	for _, q := range s.c.auth.id.Checker.SessionRequirements() {
		q := q
		rules = append(rules, party.Requirement{
			Count: q.Count, Terminate: q.OnLeave == services.OnLeaveTerminate,
			Counts: func(roles []string, mode party.Mode) bool { return q.Counts(roles, string(mode)) },
		})
	}
	if len(rules) > 0 && spec.pty == nil {
		s.c.emitRefused("session", s.getCommand(), "require_session_join: a moderated session needs a pty")
		return nil, trace.AccessDenied("your role requires a moderator to join your sessions (require_session_join): only interactive sessions with a terminal can be moderated")
	}
	return rules, nil
}

// runModerated holds a session for its moderators: the shell request is
// accepted at once (so the owner reads why nothing happens), the session
// becomes a room whose gate is held (the owner's typing is dropped, not
// queued), and the program starts only when the rules are met. Then
// watchModeration applies on_leave for as long as it runs.
func (s *session) runModerated(req *ssh.Request, spec procSpec, rules []party.Requirement) {
	room, err := s.newRoom(&s.chOut, io.Discard, spec.pty, party.Held, rules)
	if err != nil {
		s.refuse(req, err)
		return
	}
	reply(req, true)
	s.goCopy(func() { _, _ = io.Copy(room.In, s.ch) })
	s.moderationEvent(room, "waiting", "require_session_join")
	_, _ = s.chOut.WriteString("postern: waiting for a moderator to join this session (psh join --mode moderator " + s.id + ")\r\n")
	s.goCopy(func() {
		switch s.awaitModerators(room) {
		case heldOwnerGone:
			s.closeRoom()
			return
		case heldEnded:
			// A moderator ended the session before its program ran: the
			// owner reads why and gets the end of a session that never
			// started.
			s.closeRoom()
			s.closeWrite()
			_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{Status: exitNotStarted}))
			_ = s.ch.Close()
			return
		}
		if err := s.launch(spec, func() {}); err != nil {
			s.log.WithError(err).Warn("Moderated session could not start.")
			_, _ = s.chOut.WriteString(fmt.Sprintf("postern: %v\r\n", trace.UserMessage(err)))
			s.closeRoom()
			s.closeWrite()
			_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{Status: exitNotStarted}))
			_ = s.ch.Close()
			return
		}
		// Announced once input goes through: what the owner types after
		// reading it reaches the shell.
		room.In.Set(party.Open)
		room.Announce("\r\n[postern: a moderator is present; the session starts]\r\n")
		s.moderationEvent(room, "started", "")
		s.mu.Lock()
		proc := s.proc
		s.mu.Unlock()
		if s.ctx.Err() != nil {
			proc.hangUp(s.c.cfg.Clock)
			return
		}
		select {
		case <-s.ended:
			// Ended by a moderator while the program started.
			proc.hangUp(s.c.cfg.Clock)
			return
		default:
		}
		s.watchModeration(room, proc.exited)
	})
}

// heldOutcome is how a held session's wait for its moderators ended.
type heldOutcome int

const (
	heldMet heldOutcome = iota
	heldOwnerGone
	heldEnded
)

// awaitModerators waits until the room's rules are met, the owner goes
// away, or a moderator (who joined while others were still missing) ends
// the session.
func (s *session) awaitModerators(room *party.Session) heldOutcome {
	for {
		changed := room.Changed()
		select {
		case <-s.ended:
			return heldEnded
		default:
		}
		if room.Moderation() == party.Met {
			return heldMet
		}
		select {
		case <-changed:
		case <-s.ctx.Done():
			return heldOwnerGone
		case <-s.ended:
			return heldEnded
		}
	}
}

// watchModeration applies on_leave while the program runs: input paused
// (and resumed when enough moderators are back), or the session ended.
func (s *session) watchModeration(room *party.Session, exited <-chan struct{}) {
	paused := false
	for {
		changed := room.Changed()
		switch room.Moderation() {
		case party.Met:
			if paused {
				paused = false
				room.In.Set(party.Open)
				s.moderationEvent(room, "resumed", "")
				room.Announce("\r\n[postern: a moderator is back; input resumed]\r\n")
			}
		case party.Pause:
			if !paused {
				paused = true
				room.In.Set(party.Paused)
				s.moderationEvent(room, "paused", "the last moderator left")
				room.Announce("\r\n[postern: no moderator present; input is paused until one joins]\r\n")
			}
		case party.Terminate:
			room.In.Set(party.Paused)
			s.moderationEvent(room, "terminated", "the last moderator left")
			room.Announce("\r\n[postern: the last moderator left; the session ends]\r\n")
			if room.End != nil {
				room.End()
			}
			return
		}
		select {
		case <-changed:
		case <-exited:
			return
		}
	}
}

// moderationEvent audits a moderated session's state and marks it in the
// recording (once there is one).
func (s *session) moderationEvent(room *party.Session, state, reason string) {
	fields := events.Fields{events.FieldSessionID: room.ID, "state": state, "session_user": room.User}
	if reason != "" {
		fields[events.FieldReason] = reason
	}
	s.c.emit(events.SessionModeration, fields)
	if room.Mark != nil {
		room.Mark("session.moderation: " + state)
	}
	s.log.WithField("state", state).Info("Moderated session.")
}
