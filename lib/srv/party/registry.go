package party

import (
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
)

// Mode is how a party takes part in a session.
type Mode string

const (
	// Observer sees the output and cannot type.
	Observer Mode = "observer"
	// Peer sees the output and may type.
	Peer Mode = "peer"
	// Moderator may type and may end the session for everyone; only
	// moderators count for a session that requires them.
	Moderator Mode = "moderator"
)

// Modes are the modes, in order of what they allow.
var Modes = []Mode{Observer, Peer, Moderator}

// ParseMode reads a mode as a user writes it.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", trace.BadParameter("unknown session join mode %q (want observer, peer or moderator)", s)
}

// ParseSessionID checks a session id from outside (a join request): the
// node's session ids are UUIDs, and anything else is refused before it
// is looked up or logged.
func ParseSessionID(s string) (string, error) {
	if len(s) != 36 {
		return "", trace.BadParameter("malformed session id %q: want a UUID", truncate(s))
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return "", trace.BadParameter("malformed session id %q: want a UUID", truncate(s))
	}
	return u.String(), nil
}

func truncate(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// Session is a live interactive session as others may join it.
type Session struct {
	ID      string
	User    string
	Login   string
	Roles   []string
	Node    string
	Started time.Time
	// Out is the session's output; In is the gate to its program.
	Out *Broadcaster
	In  *Gate
	// Notify prints a line in the owner's terminal (outside the session's
	// output and recording); Mark puts a marker in the recording; End
	// ends the session for everyone. Each may be nil.
	Notify func(msg string)
	Mark   func(marker string)
	End    func()

	mu      sync.Mutex
	parties map[*Party]struct{}
}

// Party is one joined participant.
type Party struct {
	User   string
	Roles  []string
	Mode   Mode
	Joined time.Time
}

// Info is what a listing shows of a session.
type Info struct {
	ID           string    `json:"id"`
	User         string    `json:"user"`
	Login        string    `json:"login"`
	Node         string    `json:"node"`
	Started      time.Time `json:"started"`
	Participants []string  `json:"participants"`
}

// Announce prints msg in every participant's terminal, the owner's too.
func (s *Session) Announce(msg string) {
	s.Out.Notice(msg)
	if s.Notify != nil {
		s.Notify(msg)
	}
}

// AddParty adds p to the session.
func (s *Session) AddParty(p *Party) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parties == nil {
		s.parties = map[*Party]struct{}{}
	}
	s.parties[p] = struct{}{}
}

// RemoveParty removes p and returns how many moderators are left.
func (s *Session) RemoveParty(p *Party) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.parties, p)
	return s.countLocked(Moderator)
}

// Count is how many parties in mode m are joined.
func (s *Session) Count(m Mode) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.countLocked(m)
}

func (s *Session) countLocked(m Mode) int {
	n := 0
	for p := range s.parties {
		if p.Mode == m {
			n++
		}
	}
	return n
}

// Info is the session's listing: the owner first, then the parties in
// the order they joined ("user (mode)").
func (s *Session) Info() Info {
	s.mu.Lock()
	parties := make([]*Party, 0, len(s.parties))
	for p := range s.parties {
		parties = append(parties, p)
	}
	s.mu.Unlock()
	sort.Slice(parties, func(i, j int) bool { return parties[i].Joined.Before(parties[j].Joined) })
	who := []string{s.User}
	for _, p := range parties {
		who = append(who, p.User+" ("+string(p.Mode)+")")
	}
	return Info{ID: s.ID, User: s.User, Login: s.Login, Node: s.Node, Started: s.Started, Participants: who}
}

// Registry is a node's live interactive sessions by id.
type Registry struct {
	mu       sync.Mutex
	sessions map[string]*Session
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{sessions: map[string]*Session{}} }

// Add registers s; an id already present is refused.
func (r *Registry) Add(s *Session) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.sessions[s.ID]; ok {
		return trace.AlreadyExists("session %v is already registered", s.ID)
	}
	r.sessions[s.ID] = s
	return nil
}

// Remove forgets session id.
func (r *Registry) Remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.sessions, id)
}

// Get finds session id; not found is the same error whether the session
// never existed or ended.
func (r *Registry) Get(id string) (*Session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sessions[id]
	if !ok {
		return nil, trace.NotFound("session %v not found", id)
	}
	return s, nil
}

// List is every registered session, oldest first.
func (r *Registry) List() []*Session {
	r.mu.Lock()
	out := make([]*Session, 0, len(r.sessions))
	for _, s := range r.sessions {
		out = append(out, s)
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}

// JoinPrefix starts the subsystem name that joins a session:
// "join@SESSION_ID", or "join@SESSION_ID/MODE" (observer when left out).
const JoinPrefix = "join@"

// JoinSubsystem is the subsystem name that joins session id in mode.
func JoinSubsystem(id string, mode Mode) string { return JoinPrefix + id + "/" + string(mode) }

// ParseJoinRequest reads a join subsystem name from a client. Anything
// but a well-formed UUID and a known mode is refused, with what was
// wrong named, before anything is looked up.
func ParseJoinRequest(name string) (id string, mode Mode, err error) {
	rest, ok := strings.CutPrefix(name, JoinPrefix)
	if !ok {
		return "", "", trace.BadParameter("not a join request: %q", truncate(name))
	}
	rawID, rawMode, hasMode := strings.Cut(rest, "/")
	if id, err = ParseSessionID(rawID); err != nil {
		return "", "", err
	}
	mode = Observer
	if hasMode {
		if mode, err = ParseMode(rawMode); err != nil {
			return "", "", err
		}
	}
	return id, mode, nil
}

// ListSubsystem is the node subsystem that lists the live sessions the
// caller may join (a JSON array of Info).
const ListSubsystem = "sessions"
