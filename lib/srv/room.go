package srv

import (
	"io"
	"sync"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/srv/party"
)

// openRoom makes a pty session joinable: its output (out: the owner's
// channel, with the recording teed in) becomes a broadcast whose
// subscribers are the joined parties, and its input (in: the pty, with
// the recording teed in) a gate that the owner and every peer type
// through. The room is in the node's registry, by the session id the
// owner reads in SSH_SESSION_ID, until closeRoom.
//
// Only pty sessions are rooms: an exec or a file transfer has no screen
// to share, and its bytes are not a terminal's.
//
// A session held for its moderators already has its room (and the copy
// of the owner's input into its gate, copyIn false): the program's output
// and terminal take the places of the owner's channel and nothing.
func (s *session) openRoom(out, in io.Writer, pty *ptyRequest) (_, _ io.Writer, copyIn bool) {
	s.mu.Lock()
	held := s.room
	s.mu.Unlock()
	if held != nil {
		held.Out.SetPrimary(out)
		held.In.SetDst(in)
		return held.Out, held.In, false
	}
	if s.c.srv.parties == nil || pty == nil {
		return out, in, true
	}
	room, err := s.newRoom(out, in, pty, party.Open, nil)
	if err != nil {
		// A session id is a fresh UUID: a clash is a bug, and the session
		// runs as before, unjoinable, rather than fail.
		s.log.WithError(err).Warn("Session could not be made joinable.")
		return out, in, true
	}
	return room.Out, room.In, true
}

// newRoom registers the session as a room whose output goes first to
// primary and whose open gate leads to dst.
func (s *session) newRoom(primary, dst io.Writer, pty *ptyRequest, st party.GateState, rules []party.Requirement) (*party.Session, error) {
	reg := s.c.srv.parties
	if reg == nil {
		return nil, trace.NotImplemented("this server holds no joinable sessions")
	}
	bc := party.NewBroadcaster(party.Config{Primary: primary, Cols: int(pty.Columns), Rows: int(pty.Rows), Clock: s.c.cfg.Clock})
	room := &party.Session{
		ID: s.id, User: s.c.auth.id.User, Login: s.c.auth.id.Login, Roles: append([]string(nil), s.c.auth.id.Roles...),
		Node: s.c.auth.node.Hostname, Started: s.c.cfg.Clock.Now().UTC(),
		Out: bc, In: party.NewGate(dst, st), Require: rules,
	}
	// Notices reach the owner's channel only until finish half-closes it
	// (x/crypto's channel does not order a Write against CloseWrite),
	// queued: announcing a join or a leave never waits for an owner who
	// is not reading (see party.Notices).
	notices := party.NewNotices(&s.chOut, 0)
	room.Notify = notices.Send
	s.mu.Lock()
	s.notices = notices
	s.mu.Unlock()
	room.Mark = func(m string) {
		s.mu.Lock()
		rec := s.rec
		s.mu.Unlock()
		if rec != nil {
			rec.Marker(m)
		}
	}
	// End is a moderator's end for everyone: it hangs the program up, or,
	// for a session still held for its moderators (no program yet), ends
	// the wait; closing ended first lets a program that starts meanwhile
	// see it (runModerated) so that no end is lost between the two.
	room.End = func() {
		s.endOnce.Do(func() { close(s.ended) })
		s.mu.Lock()
		proc := s.proc
		s.mu.Unlock()
		if proc != nil {
			proc.hangUp(s.c.cfg.Clock)
		}
	}
	if err := reg.Add(room); err != nil {
		return nil, trace.Wrap(err)
	}
	s.mu.Lock()
	s.room = room
	s.mu.Unlock()
	return room, nil
}

// closeRoom takes the session out of the registry and ends every joined
// party's view (they read what is queued, then the end).
func (s *session) closeRoom() {
	s.mu.Lock()
	room, notices := s.room, s.notices
	s.mu.Unlock()
	if room == nil {
		return
	}
	s.c.srv.parties.Remove(room.ID)
	room.Out.Close()
	if notices != nil {
		notices.Close(s.ctx.Done())
	}
	s.chOut.Close()
}

// closableWriter writes to w until Close, never at the same time as it:
// a line written from another goroutine than the channel's owner (a
// notice, a refusal) cannot race the channel's half-close.
type closableWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (c *closableWriter) WriteString(msg string) (int, error) {
	return c.Write([]byte(msg))
}

func (c *closableWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.w == nil {
		return 0, io.ErrClosedPipe
	}
	return c.w.Write(p)
}

// Close stops the writes; what the caller does next (a half-close) no
// longer meets one.
func (c *closableWriter) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// resizeRoom tells the room the terminal's new size (for the screens it
// rebuilds for joiners).
func (s *session) resizeRoom(cols, rows uint32) {
	s.mu.Lock()
	room := s.room
	s.mu.Unlock()
	if room != nil {
		room.Out.Resize(int(cols), int(rows))
	}
}
