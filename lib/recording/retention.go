package recording

import (
	"context"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/postern-dev/postern/lib/observe"
)

// DefaultRetentionInterval is how often retention looks for recordings
// past their age: a recording outlives its retention by at most this
// much, and a pass lists the store only this often.
const DefaultRetentionInterval = time.Hour

// RetentionStore is what retention needs of a Storage.
type RetentionStore interface {
	List(ctx context.Context) ([]Meta, error)
	DeleteRecording(ctx context.Context, session string) error
}

var _ RetentionStore = Storage(nil)

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	// Store is the auth server's recording store. Required.
	Store RetentionStore
	// MaxAge: a recording whose session started longer ago than this is
	// deleted. Required (positive).
	MaxAge time.Duration
	// Interval between passes; zero means DefaultRetentionInterval.
	Interval time.Duration
	// Deleted is told the ids a pass deleted (the auth service audits
	// them); nil means nobody.
	Deleted func(ctx context.Context, sessions []string)
	// Deps: Clock drives the passes and the age.
	observe.Deps
}

// CheckAndSetDefaults validates the config.
func (c *RetentionConfig) CheckAndSetDefaults() error {
	if c.Store == nil {
		return trace.BadParameter("recording retention: missing Store")
	}
	if c.MaxAge <= 0 {
		return trace.BadParameter("recording retention: MaxAge %v is not positive", c.MaxAge)
	}
	if c.Interval <= 0 {
		c.Interval = DefaultRetentionInterval
	}
	c.Deps.SetDefaults(observe.ComponentRetention)
	return nil
}

// Retention deletes recordings older than MaxAge, one pass at start and
// then every Interval. Several auth servers sharing a store each run one:
// deletes are idempotent, so the worst overlap is two passes deleting the
// same recording and both reporting it.
type Retention struct {
	cfg    RetentionConfig
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// mu serialises passes (the loop's and Sweep called from outside).
	mu sync.Mutex
}

// NewRetention starts the retention loop; Close stops it.
func NewRetention(cfg RetentionConfig) (*Retention, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	r := &Retention{cfg: cfg, done: make(chan struct{})}
	// Retention owns its passes (Close ends them): no caller's context.
	r.ctx, r.cancel = context.WithCancel(context.Background())
	go r.run()
	return r, nil
}

// Close stops the loop (a pass in progress is cancelled) and waits.
func (r *Retention) Close() error {
	r.cancel()
	<-r.done
	return nil
}

func (r *Retention) run() {
	defer close(r.done)
	ticker := r.cfg.Clock.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	for {
		if _, err := r.Sweep(r.ctx); err != nil && r.ctx.Err() == nil {
			r.cfg.Logger.WithError(err).Warn("Recording retention pass failed; will retry at the next one.")
		}
		select {
		case <-r.ctx.Done():
			return
		case <-ticker.Chan():
		}
	}
}

// Sweep runs one pass: it deletes every recording whose session started
// before now minus MaxAge and returns their ids. A failed delete stops
// the pass (what was deleted before it is reported); the next pass finds
// the rest.
func (r *Retention) Sweep(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list, err := r.cfg.Store.List(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cutoff := r.cfg.Clock.Now().Add(-r.cfg.MaxAge)
	var deleted []string
	var failed error
	for _, m := range list {
		if !time.Unix(m.Timestamp, 0).Before(cutoff) {
			continue
		}
		if err := r.cfg.Store.DeleteRecording(ctx, m.SessionID); err != nil {
			failed = trace.Wrap(err, "deleting recording %s", m.SessionID)
			break
		}
		deleted = append(deleted, m.SessionID)
	}
	if len(deleted) > 0 {
		r.cfg.Logger.WithField("count", len(deleted)).Infof("Deleted recordings older than %v.", r.cfg.MaxAge)
		if r.cfg.Deleted != nil {
			r.cfg.Deleted(ctx, deleted)
		}
	}
	return deleted, failed
}
