package party

// Requirement is one rule a moderated session must meet before its
// program starts and while it runs: Count parties for which Counts is
// true. Observers never count, whatever Counts says.
type Requirement struct {
	Count int
	// Terminate: the session ends when the rule is no longer met;
	// otherwise its input is paused until it is.
	Terminate bool
	Counts    func(roles []string, mode Mode) bool
}

// Verdict is what a moderated session's rules say now.
type Verdict int

const (
	// Met: every rule is met.
	Met Verdict = iota
	// Pause: a rule is not met and none that is not says terminate.
	Pause
	// Terminate: a rule that says terminate is not met.
	Terminate
)

// Moderation reports what the session's rules say of who is joined now.
func (s *Session) Moderation() Verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := Met
	for _, r := range s.Require {
		n := 0
		for p := range s.parties {
			if p.Mode != Observer && r.Counts(p.Roles, p.Mode) {
				n++
			}
		}
		if n >= r.Count {
			continue
		}
		if r.Terminate {
			return Terminate
		}
		v = Pause
	}
	return v
}

// Changed returns a channel closed at the next join or leave.
func (s *Session) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// changedLocked wakes whoever waits on Changed.
func (s *Session) changedLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}
