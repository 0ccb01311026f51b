package services

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
)

// A proxy or node checks every login against views kept by watches (the
// AccessCache's CAs, roles and trusted clusters; the LockWatcher's
// locks). When a watch breaks, the view can no longer be vouched for:
// refusing at once turns every backend outage (an etcd quorum loss, auth
// restarting) into a full SSH outage for users whose certificates are
// perfectly valid. Yet while the backend is down nothing can be written,
// so the last view is exactly what a backend read would have answered;
// the only case where it is wrong is a partition of this one process
// from a backend that others can still write, and there the staleness
// is how late a lock, a removed role or a rotated CA applies here. So a
// view answers from its last state for a bounded time after its watch
// broke, counting and logging every such answer, and refuses past the
// bound (and always when it was never loaded): deny by default resumes.

// staleness decides whether a view whose watch is broken may still answer,
// and counts what it decided so that operators see stale answers
// (postern_access_stale_*).
type staleness struct {
	// view names the view in logs: "roles and certificate authorities".
	view string
	// max is the bound; zero refuses as soon as the watch breaks, and a
	// negative bound never refuses on staleness (the caller's choice).
	max   time.Duration
	clock clockwork.Clock
	log   logrus.FieldLogger

	answers  atomic.Uint64
	refusals atomic.Uint64

	// mu guards the two below: the start of the latest break logged as
	// answered from and as refused past the bound, so that an outage logs
	// once each way (its watchers break together) rather than per login.
	mu         sync.Mutex
	answeredAt time.Time
	refusedAt  time.Time
}

// firstOf reports whether the break that started at brokeAt is newer than
// *logged (answeredAt or refusedAt), and records it: once per outage.
func (s *staleness) firstOf(logged *time.Time, brokeAt time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !brokeAt.After(*logged) {
		return false
	}
	*logged = brokeAt
	return true
}

// check returns nil while health is nil, and for a broken watch whose
// break started at brokeAt while it is younger than the bound; otherwise
// a ConnectionProblem. A zero brokeAt with an error is a view that was
// never live: always refused.
func (s *staleness) check(brokeAt time.Time, health error) error {
	if health == nil {
		return nil
	}
	if brokeAt.IsZero() || s.max == 0 {
		return trace.Wrap(health)
	}
	d := s.clock.Since(brokeAt)
	if s.max < 0 || d < s.max {
		s.answers.Add(1)
		if s.firstOf(&s.answeredAt, brokeAt) {
			s.log.WithError(health).WithFields(logrus.Fields{"stale_for": d.String(), "max_stale": s.max.String()}).
				Warn("Answering from the last view of " + s.view + ": its watch is broken and re-syncing.")
		}
		return nil
	}
	s.refusals.Add(1)
	if s.firstOf(&s.refusedAt, brokeAt) {
		s.log.WithError(health).WithFields(logrus.Fields{"stale_for": d.String(), "max_stale": s.max.String()}).
			Error("Refusing: the last view of " + s.view + " is older than its bound and its watch is still broken.")
	}
	return trace.ConnectionProblem(health, "the %s of this server have not been current for %s (the auth server or its backend is unavailable)",
		s.view, d.Truncate(time.Second))
}

// StaleStats is what a view reports about answers from a broken watch.
type StaleStats struct {
	// Answers counts answers given from the last view while its watch
	// was broken, within the bound.
	Answers uint64
	// Refusals counts refusals because the view was older than the bound.
	Refusals uint64
	// StaleFor is how long the view has not been current (zero while its
	// watch is live or before it was ever loaded).
	StaleFor time.Duration
}

func (s *staleness) stats(brokeAt time.Time) StaleStats {
	st := StaleStats{Answers: s.answers.Load(), Refusals: s.refusals.Load()}
	if !brokeAt.IsZero() {
		st.StaleFor = s.clock.Since(brokeAt)
	}
	return st
}
