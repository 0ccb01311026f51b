package limiter

import (
	"math"
	"net"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/sirupsen/logrus"
)

// Rate defaults, for new connections per source address.
//
// Failed logins are already limited by lib/auth (a lockout after
// auth.DefaultMaxLoginFailures failures per user and per address), so this
// limiter is not for passwords. It is for what happens before any
// credential is checked: every new SSH connection costs a key exchange and a
// host-key signature, and every TLS connection a handshake, whether or not
// the client ever authenticates. A concurrency cap does not bound that — a
// client that connects, fails and reconnects in a tight loop never holds
// more than one connection.
const (
	// DefaultConnectionRate is the sustained rate of new connections one
	// address may open: 20 a second is far above what people and
	// automation open (a burst, then long-lived sessions), and at the cost
	// of a handshake (well under a millisecond of CPU with ed25519 and
	// curve25519) it caps one address at a few percent of a core.
	DefaultConnectionRate = 20.0
	// DefaultConnectionBurst lets a fan-out (Ansible with a couple of
	// hundred forks) open up to its per-address connection cap at once.
	DefaultConnectionBurst = DefaultMaxConnectionsPerIP
	// DefaultMaxRateKeys bounds the limiter's memory: a flood from made-up
	// keys cannot grow it past this many buckets (about 10 MB). When full,
	// buckets that have refilled completely carry no state and are swept;
	// if it is still full, an unknown key is allowed without being tracked:
	// the accounting fails open, the caps behind it still hold.
	DefaultMaxRateKeys = 100_000
)

// RateConfig configures a RateLimiter.
type RateConfig struct {
	// Name labels refusals in metrics (`listener`) and logs.
	Name string
	// Rate is the sustained number of events per second per key; zero
	// means DefaultConnectionRate.
	Rate float64
	// Burst is how many events a key may spend at once (the bucket size);
	// zero means DefaultConnectionBurst.
	Burst int
	// MaxKeys bounds the number of tracked keys; zero means
	// DefaultMaxRateKeys.
	MaxKeys int
	// Deps: Clock refills the buckets; Metrics as in Config.
	observe.Deps
}

// CheckAndSetDefaults validates and fills in defaults.
func (c *RateConfig) CheckAndSetDefaults() error {
	if c.Name == "" {
		c.Name = "default"
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		return trace.BadParameter("limiter: invalid rate %v", c.Rate)
	}
	if c.Rate == 0 {
		c.Rate = DefaultConnectionRate
	}
	if c.Burst < 0 {
		return trace.BadParameter("limiter: negative burst %d", c.Burst)
	}
	if c.Burst == 0 {
		c.Burst = DefaultConnectionBurst
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = DefaultMaxRateKeys
	}
	c.Deps.SetDefaults(observe.ComponentLimiter)
	return nil
}

// RateLimiter is a token bucket per key on the Clock. Safe for concurrent
// use.
type RateLimiter struct {
	cfg     RateConfig
	metrics *metrics

	// mu guards buckets.
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

// NewRateLimiter creates a rate limiter.
func NewRateLimiter(cfg RateConfig) (*RateLimiter, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &RateLimiter{cfg: cfg, metrics: m, buckets: map[string]*bucket{}}, nil
}

// Allow spends one token of key, or returns trace.LimitExceeded saying when
// to try again.
func (r *RateLimiter) Allow(key string) error {
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	b := r.buckets[key]
	if b == nil {
		if len(r.buckets) >= r.cfg.MaxKeys {
			r.sweepLocked(now)
			if len(r.buckets) >= r.cfg.MaxKeys {
				r.mu.Unlock()
				return nil
			}
		}
		b = &bucket{tokens: float64(r.cfg.Burst), last: now}
		r.buckets[key] = b
	}
	r.refill(b, now)
	if b.tokens >= 1 {
		b.tokens--
		r.mu.Unlock()
		return nil
	}
	wait := time.Duration((1 - b.tokens) / r.cfg.Rate * float64(time.Second))
	r.mu.Unlock()
	r.metrics.refusals.WithLabelValues(r.cfg.Name, CapRate).Inc()
	err := trace.LimitExceeded("too many new connections from %s: limit %v per second; try again in %v",
		key, r.cfg.Rate, wait.Round(time.Millisecond))
	r.cfg.Logger.WithFields(logrus.Fields{"listener": r.cfg.Name, "cap": CapRate, "key": key}).
		WithError(err).Debug("Refused: rate limit reached.")
	return err
}

// AllowAddr is Allow keyed by a remote address (IPv4 address or IPv6 /64,
// as for the per-address cap). Addresses with no IP are always allowed.
func (r *RateLimiter) AllowAddr(addr net.Addr) error {
	key, _ := ipKey(addr)
	if key == "" {
		return nil
	}
	return r.Allow(key)
}

// refundAddr gives back a token AllowAddr spent for addr (a connection
// that authenticated: see ListenerOptions.Handshakes), never past the
// bucket's size.
func (r *RateLimiter) refundAddr(addr net.Addr) {
	key, _ := ipKey(addr)
	if key == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.buckets[key]; b != nil {
		b.tokens = math.Min(float64(r.cfg.Burst), b.tokens+1)
	}
}

// Len is the number of tracked keys (tests, diagnostics).
func (r *RateLimiter) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.buckets)
}

func (r *RateLimiter) refill(b *bucket, now time.Time) {
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = math.Min(float64(r.cfg.Burst), b.tokens+elapsed.Seconds()*r.cfg.Rate)
		b.last = now
	}
}

// sweepLocked drops full buckets: a full bucket is the same as no bucket.
// r.mu held.
func (r *RateLimiter) sweepLocked(now time.Time) {
	for k, b := range r.buckets {
		r.refill(b, now)
		if b.tokens >= float64(r.cfg.Burst) {
			delete(r.buckets, k)
		}
	}
}
