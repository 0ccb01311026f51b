package srv

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/srv/party"
)

// joined is a session channel that joined another session (a room):
// what it sees is the room's broadcast, what it types goes through the
// room's gate (or nowhere, for an observer).
type joined struct {
	room  *party.Session
	party *party.Party
	leave func()
}

// startNodeSubsystemOrJoin serves a node's subsystems: a join request
// ("join@SESSION_ID/MODE") joins a live session, anything else is
// startNodeSubsystem's.
func (s *session) startNodeSubsystemOrJoin(req *ssh.Request, name string) {
	if strings.HasPrefix(name, party.JoinPrefix) {
		s.startJoin(req, name)
		return
	}
	if name == party.ListSubsystem {
		s.listRooms(req)
		return
	}
	s.startNodeSubsystem(req, name)
}

// startJoin joins the session a join request names, when the joiner's
// roles allow that mode on the owner's roles (join_sessions). A session
// the joiner may not join is answered exactly as one that does not exist:
// not found, so that its existence is never revealed; the audit trail
// has the real reason.
func (s *session) startJoin(req *ssh.Request, name string) {
	id, mode, err := party.ParseJoinRequest(name)
	if err != nil {
		s.c.emitRefused("session.join", "", err.Error())
		s.refuse(req, err)
		return
	}
	notFound := trace.NotFound("session %v not found", id)
	room, err := s.c.srv.parties.Get(id)
	if err != nil {
		s.c.emitRefused("session.join", id, "no such live session on this node")
		s.refuse(req, notFound)
		return
	}
	if s.c.auth.id.Checker == nil || !s.c.auth.id.Checker.CanJoinSession(room.Roles, string(mode)) {
		s.c.emitRefused("session.join", id, fmt.Sprintf("no join_sessions rule of the user's roles allows joining this session as %s", mode))
		s.refuse(req, notFound)
		return
	}
	sub, err := room.Out.Subscribe()
	if err != nil {
		s.c.emitRefused("session.join", id, "the session ended")
		s.refuse(req, notFound)
		return
	}
	user := s.c.auth.id.User
	p := &party.Party{User: user, Roles: append([]string(nil), s.c.auth.id.Roles...), Mode: mode, Joined: s.c.cfg.Clock.Now()}
	room.AddParty(p)
	fields := func() events.Fields {
		return events.Fields{events.FieldSessionID: id, "mode": string(mode), "session_user": room.User}
	}
	var once sync.Once
	leave := func() {
		once.Do(func() {
			sub.Close()
			room.RemoveParty(p)
			s.c.emit(events.SessionLeave, fields())
			room.Mark(fmt.Sprintf("session.leave: %s (%s)", user, mode))
			room.Announce(fmt.Sprintf("\r\n[postern: %s (%s) left]\r\n", user, mode))
			s.log.WithField("mode", mode).Info("Left a session.")
		})
	}
	s.mu.Lock()
	s.join = &joined{room: room, party: p, leave: leave}
	s.mu.Unlock()
	reply(req, true)
	s.c.emit(events.SessionJoin, fields())
	room.Mark(fmt.Sprintf("session.join: %s (%s)", user, mode))
	room.Announce(fmt.Sprintf("\r\n[postern: %s joined as %s]\r\n", user, mode))
	s.log.WithFields(map[string]any{"mode": mode, "joined_session": id}).Info("Joined a session.")

	// Output: the room's screen, then its output as it comes, until the
	// session ends (the joiner gets exit-status 0) or the joiner leaves.
	s.goCopy(func() {
		defer leave()
		for {
			b, err := sub.Next(s.ctx)
			if err != nil {
				break
			}
			if _, err := s.chOut.Write(b); err != nil {
				return
			}
		}
		s.chOut.Close()
		if s.ctx.Err() != nil {
			return
		}
		s.closeWrite()
		_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{Status: 0}))
		_ = s.ch.Close()
	})
	// Input: a peer's and a moderator's keystrokes go through the gate;
	// an observer's are dropped, and the observer told so once.
	s.goCopy(func() {
		defer leave()
		var dst io.Writer = room.In
		if mode == party.Observer {
			dst = &observerInput{w: &s.chOut}
		}
		_, _ = io.Copy(dst, s.ch)
	})
}

// observerInput drops an observer's keystrokes and says so the first
// time.
type observerInput struct {
	w    *closableWriter
	told bool
}

func (o *observerInput) Write(p []byte) (int, error) {
	if !o.told && len(p) > 0 {
		o.told = true
		_, _ = o.w.WriteString("\r\n[postern: you joined as an observer; what you type is not sent]\r\n")
	}
	return len(p), nil
}

// joinedSession is the room this channel joined, nil when it did not.
func (s *session) joinedSession() *joined {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.join
}

// signalJoined is a signal request on a join channel: a moderator's ends
// the session for everyone (psh's `Ctrl-] t`); anyone else's is refused.
//
// The reply goes out before the session is ended: the end closes this
// channel too, and a reply after it would be lost.
func (s *session) signalJoined(req *ssh.Request, j *joined, sig syscall.Signal) {
	if j.party.Mode != party.Moderator || j.room.End == nil {
		s.log.WithField("mode", j.party.Mode).Warn("Refused a signal from a party that is not a moderator.")
		reply(req, false)
		return
	}
	reply(req, true)
	user := s.c.auth.id.User
	s.log.WithField("signal", signalName(sig)).Info("A moderator ended the joined session.")
	s.c.emit(events.SessionModeration, events.Fields{events.FieldSessionID: j.room.ID, "state": "terminated", events.FieldReason: "ended by moderator " + user, "session_user": j.room.User})
	j.room.Mark("session.terminate: by moderator " + user)
	j.room.Announce(fmt.Sprintf("\r\n[postern: %s (moderator) ended the session]\r\n", user))
	s.goCopy(j.room.End)
}

// listRooms answers the "sessions" subsystem: the node's live pty
// sessions the caller may join in some mode, a JSON array. A session the
// caller may not join is left out, never shown redacted.
func (s *session) listRooms(req *ssh.Request) {
	out := []party.Info{}
	for _, room := range s.c.srv.parties.List() {
		if s.c.auth.id.Checker != nil && s.c.auth.id.Checker.CanJoinSessionAnyMode(room.Roles) {
			out = append(out, room.Info())
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		s.refuse(req, trace.Wrap(err))
		return
	}
	reply(req, true)
	_, _ = s.ch.Write(append(b, '\n'))
	s.closeWrite()
	_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{Status: 0}))
	_ = s.ch.Close()
}
