package events

// The sinks: one queue and one writer goroutine per destination (the
// file, the backend, the auth server), batching what is queued.

import (
	"context"
	"sync/atomic"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backoff"
)

// record is one queued item: an event, or a flush marker.
type record struct {
	event   Event
	line    []byte
	flushed chan struct{}
}

// sink is one destination with its own writer goroutine, so that a slow
// backend never delays the file. The file sink and, without a Dir, the
// backend and remote sinks are fed by a queue; with a Dir, the backend
// and remote sinks follow the file instead (wal.go).
type sink struct {
	name  string
	l     *Log
	queue chan record
	// write, for the file, writes a batch and says how many of its
	// events it failed to write; a failure is counted, not retried.
	write func([]record) (failed int, err error)
	// deliver, for the backend and remote sinks, writes a batch; a
	// failure is retried with backoff (deliverWithRetry) unless
	// permanent (nil: none is) says it never can succeed.
	deliver   func(context.Context, []record) error
	permanent func(error) bool
	// dropping is true from the first dropped event to the next queued
	// one: one Warn per streak of drops.
	dropping atomic.Bool
	// failing is the same for write errors; touched by the writer only.
	failing bool
	// ahead counts this sink's pending events: for a follower, the
	// lines in the file past its cursor; for a queue-fed durable sink,
	// the events queued or being written.
	ahead atomic.Int64

	follower // wal.go; unused by queue-fed sinks
}

func (l *Log) newSink(name string, write func([]record) (int, error)) *sink {
	return &sink{name: name, l: l, queue: make(chan record, l.cfg.QueueSize), write: write}
}

func (s *sink) enqueue(r record) {
	select {
	case s.queue <- r:
		if s.write != nil {
			s.l.queued.Add(1)
		} else {
			s.ahead.Add(1)
		}
		if s.dropping.Swap(false) {
			s.l.log.WithField("sink", s.name).Info("Audit queue has room again.")
		}
	default:
		s.l.metrics.dropped.WithLabelValues(s.name).Inc()
		if !s.dropping.Swap(true) {
			s.l.log.WithFields(logrus.Fields{"sink": s.name, "event": r.event.Type}).
				Error("Audit queue is full: dropping events until it drains.")
		}
	}
}

// updatePending sets postern_audit_pending for every durable sink.
func (l *Log) updatePending() {
	if len(l.durable) == 0 {
		return
	}
	l.pendingMu.Lock()
	defer l.pendingMu.Unlock()
	queued := l.queued.Load()
	for _, s := range l.durable {
		v := s.ahead.Load()
		if s.queue == nil { // a follower: the file's queue is ahead of it too
			v += queued
		}
		l.metrics.pending.WithLabelValues(s.name).Set(float64(v))
	}
}

func (s *sink) run() {
	// Events are written in batches (collect): one file write and one
	// backend transaction (one fsync) per batch instead of per event.
	// Under load (a proxy setting up hundreds of sessions a second, each
	// with its events) per-event writes were the largest part of the
	// process's CPU per connection.
	for r := range s.queue {
		batch, acks := s.collect(r)
		if len(batch) > 0 {
			if s.write != nil {
				s.writeBatch(batch)
			} else {
				if !s.deliverWithRetry(batch) {
					// Close's grace ran out; without a Dir there
					// is no file to replay them from.
					s.l.metrics.dropped.WithLabelValues(s.name).Add(float64(len(batch)))
				}
				s.ahead.Add(-int64(len(batch)))
				s.l.updatePending()
			}
		}
		for _, ack := range acks {
			close(ack)
		}
	}
}

// collect is the batch that starts with first: whatever is queued behind
// it, and for up to BatchWait what arrives, until the batch is full, a
// flush marker arrives (its ack is due once the batch is written) or the
// queue closes.
func (s *sink) collect(first record) (batch []record, acks []chan struct{}) {
	cfg := &s.l.cfg
	size := 0
	add := func(r record) {
		if r.flushed != nil {
			acks = append(acks, r.flushed)
			return
		}
		batch = append(batch, r)
		size += len(r.line)
	}
	add(first)
	full := func() bool { return len(batch) >= cfg.BatchSize || size >= maxBatchBytes }
	// drain takes what is queued already; false when the queue closed.
	drain := func() bool {
		for !full() {
			select {
			case r, ok := <-s.queue:
				if !ok {
					return false
				}
				add(r)
			default:
				return true
			}
		}
		return true
	}
	if !drain() || cfg.BatchWait <= 0 || len(acks) > 0 || full() {
		return batch, acks
	}
	timer := cfg.Clock.NewTimer(cfg.BatchWait)
	defer timer.Stop()
	for !full() && len(acks) == 0 {
		select {
		case r, ok := <-s.queue:
			if !ok {
				return batch, acks
			}
			add(r)
		case <-timer.Chan():
			drain()
			return batch, acks
		}
	}
	return batch, acks
}

// writeBatch writes one batch to the file, counting each event not
// written as a write error. The file is local: a failed write (a full
// disk) is not retried, and its events reach neither the file nor the
// followers, which read the file; they are counted as dropped for them.
func (s *sink) writeBatch(batch []record) {
	failed, err := s.write(batch)
	// The followers count the lines written before they leave the
	// queue, so the pending gauge never dips below the truth.
	s.l.fileWritten(int64(len(batch) - failed))
	s.l.queued.Add(-int64(len(batch)))
	s.l.updatePending()
	switch {
	case err != nil:
		s.l.metrics.writeErrors.WithLabelValues(s.name).Add(float64(failed))
		for _, f := range s.l.followers {
			s.l.metrics.dropped.WithLabelValues(f.name).Add(float64(failed))
		}
		if !s.failing {
			s.failing = true
			s.l.log.WithError(err).WithField("sink", s.name).Error("Cannot write audit events; will keep trying.")
		}
	case s.failing:
		s.failing = false
		s.l.log.WithField("sink", s.name).Info("Audit events are being written again.")
	}
}

// deliverWithRetry writes one batch to the backend or ships it to auth,
// retrying with backoff (on the Clock) until it is taken, refused for
// good (permanent), or Close's grace runs out (false). A backend error is
// never permanent: CreateMany skips the events a failed attempt did
// write, so retrying a batch never doubles an event.
func (s *sink) deliverWithRetry(batch []record) bool {
	cfg := &s.l.cfg
	b := backoff.Backoff{Min: cfg.RetryMin, Max: cfg.RetryMax}
	for {
		ctx, cancel := context.WithTimeout(s.l.ctx, cfg.BackendTimeout)
		err := s.deliver(ctx, batch)
		cancel()
		if err == nil {
			if s.failing {
				s.failing = false
				s.l.log.WithField("sink", s.name).Info("Audit events are being stored again.")
			}
			return true
		}
		s.l.metrics.writeErrors.WithLabelValues(s.name).Add(float64(len(batch)))
		if s.permanent != nil && s.permanent(err) {
			s.l.metrics.dropped.WithLabelValues(s.name).Add(float64(len(batch)))
			s.l.log.WithError(err).WithFields(logrus.Fields{"sink": s.name, "events": len(batch)}).
				Error("The auth server refused a batch of audit events; dropped it.")
			return true
		}
		if !s.failing {
			s.failing = true
			s.l.log.WithError(err).WithField("sink", s.name).Error("Cannot write audit events; will keep trying.")
		}
		if !s.sleep(&b) {
			return false
		}
	}
}

// sleep waits for b's next delay on the Clock; false when Close's grace
// ran out first.
func (s *sink) sleep(b *backoff.Backoff) bool {
	timer := s.l.cfg.Clock.NewTimer(b.Next())
	defer timer.Stop()
	select {
	case <-timer.Chan():
		return true
	case <-s.l.ctx.Done():
		return false
	}
}

// permanentShipError says a retry cannot succeed: the auth server
// understood the batch and refused it (or has no such endpoint).
func permanentShipError(err error) bool {
	return trace.IsBadParameter(err) || trace.IsAccessDenied(err) || trace.IsNotFound(err) || trace.IsNotImplemented(err)
}

// writeFile appends the batch's lines in one write: O_APPEND keeps each
// write whole at the end of the file, so readers still see whole lines.
func (l *Log) writeFile(batch []record) (int, error) {
	n := 0
	for _, r := range batch {
		n += len(r.line) + 1
	}
	buf := make([]byte, 0, n)
	for _, r := range batch {
		buf = append(append(buf, r.line...), '\n')
	}
	if _, err := l.file.Write(buf); err != nil {
		return len(batch), trace.ConvertSystemError(err)
	}
	return 0, nil
}

// writeBackend creates the batch's events in one backend.CreateMany.
func (l *Log) writeBackend(ctx context.Context, batch []record) error {
	// Create, not Put: an event is written once. A batch written again
	// (a retry after an error that came after the commit, a replay from
	// the file after a restart, a batch a host shipped again because its
	// first answer was lost) carries the same ids and times, so the copy
	// is skipped here instead of doubling the record, and no event can
	// overwrite another.
	items := make([]backend.Item, len(batch))
	for i, r := range batch {
		items[i] = l.backendItem(r.event, r.line)
	}
	_, err := backend.CreateMany(ctx, l.cfg.Backend, items)
	return trace.Wrap(err)
}

func (l *Log) backendItem(e Event, line []byte) backend.Item {
	return backend.Item{Key: eventKey(e), Value: line, Expires: e.Time.Add(l.cfg.TTL)}
}

// shipBatch ships the batch's events to the auth server.
func (l *Log) shipBatch(ctx context.Context, batch []record) error {
	events := make([]Event, len(batch))
	for i, r := range batch {
		events[i] = r.event
	}
	return trace.Wrap(l.cfg.Remote.ShipEvents(ctx, events))
}

// flushFor waits until every record queued on this sink before it has been
// handled; Log.mu must not be held for writing (the queue must be open).
func (s *sink) flushFor(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case s.queue <- record{flushed: ack}:
	case <-ctx.Done():
		return trace.Wrap(ctx.Err())
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return trace.Wrap(ctx.Err())
	}
}
