package party

import (
	"sort"
	"sync"
	"time"

	"github.com/gravitational/trace"
)

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

	// Require are the moderation rules (none: not moderated); set
	// before the session is registered.
	Require []Requirement

	mu      sync.Mutex
	parties map[*Party]struct{}
	changed chan struct{}
}

// Party is one joined participant.
type Party struct {
	User   string
	Roles  []string
	Mode   Mode
	Joined time.Time
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
	s.changedLocked()
}

// RemoveParty removes p and returns how many moderators are left.
func (s *Session) RemoveParty(p *Party) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.parties, p)
	s.changedLocked()
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
