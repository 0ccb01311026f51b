package auth

import (
	"net"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
)

// LoginLimits bounds failed login attempts.
type LoginLimits struct {
	// MaxFailures failed attempts within Window lock the user name, or the
	// source address, out until Window has passed since the last of them.
	// Zero means DefaultMaxLoginFailures.
	MaxFailures int
	// Window is the counting window and the lockout; zero means
	// DefaultLoginWindow.
	Window time.Duration
}

const (
	// DefaultMaxLoginFailures tolerates a few typos, not a dictionary.
	DefaultMaxLoginFailures = 5
	// DefaultLoginWindow: with 5 tries per 10 minutes an online guesser
	// gets ~700 guesses a day per user and per address.
	DefaultLoginWindow = 10 * time.Minute
	// maxLimiterEntries caps the limiter's memory: a flood of made-up user
	// names or addresses cannot grow it without bound. When full, expired
	// entries are swept; if still full, new keys are refused a slot and
	// their attempts are allowed (failing open on accounting, never on the
	// password check itself).
	maxLimiterEntries = 100_000
)

func (l *LoginLimits) setDefaults() {
	if l.MaxFailures <= 0 {
		l.MaxFailures = DefaultMaxLoginFailures
	}
	if l.Window <= 0 {
		l.Window = DefaultLoginWindow
	}
}

// loginLimiter counts failures per user name and per source address.
// Counting both is the point: per user stops a guesser focused on one
// account from many addresses, per address stops one address spraying many
// accounts.
type loginLimiter struct {
	limits LoginLimits
	clock  clockwork.Clock

	// mu guards entries.
	mu      sync.Mutex
	entries map[string]*limiterEntry
}

type limiterEntry struct {
	failures []time.Time // within the window, oldest first
	lockedTo time.Time   // zero when not locked
}

func newLoginLimiter(limits LoginLimits, clock clockwork.Clock) *loginLimiter {
	limits.setDefaults()
	return &loginLimiter{limits: limits, clock: clock, entries: make(map[string]*limiterEntry)}
}

// maxLimiterKeyLen bounds the user part of a key: names are at most 253
// bytes, and a megabyte of garbage in the user field must not become a
// megabyte of limiter memory.
const maxLimiterKeyLen = 256

func limiterKeys(user, remoteAddr string) []string {
	if len(user) > maxLimiterKeyLen {
		user = user[:maxLimiterKeyLen]
	}
	var keys []string
	if user != "" {
		keys = append(keys, "user:"+user)
	}
	if remoteAddr != "" {
		host := remoteAddr
		if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
			host = h
		}
		keys = append(keys, "addr:"+host)
	}
	return keys
}

// check refuses an attempt while the user or the address is locked out.
func (l *loginLimiter) check(user, remoteAddr string) error {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var wait time.Duration
	for _, k := range limiterKeys(user, remoteAddr) {
		e := l.entries[k]
		if e == nil || e.lockedTo.IsZero() {
			continue
		}
		if d := e.lockedTo.Sub(now); d > wait {
			wait = d
		}
	}
	if wait > 0 {
		return trace.LimitExceeded("too many failed login attempts; try again in %v", wait.Round(time.Second))
	}
	return nil
}

// failure records a failed attempt.
func (l *loginLimiter) failure(user, remoteAddr string) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range limiterKeys(user, remoteAddr) {
		e := l.entries[k]
		if e == nil {
			if len(l.entries) >= maxLimiterEntries {
				l.sweepLocked(now)
				if len(l.entries) >= maxLimiterEntries {
					continue
				}
			}
			e = &limiterEntry{}
			l.entries[k] = e
		}
		e.prune(now, l.limits.Window)
		e.failures = append(e.failures, now)
		if len(e.failures) >= l.limits.MaxFailures {
			e.lockedTo = now.Add(l.limits.Window)
		}
	}
}

// success clears the user's count. The address count is kept: an attacker
// holding one valid account must not be able to reset their address's
// budget by logging in between guesses at other accounts.
func (l *loginLimiter) success(user string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range limiterKeys(user, "") {
		delete(l.entries, k)
	}
}

func (e *limiterEntry) prune(now time.Time, window time.Duration) {
	if !e.lockedTo.IsZero() && !now.Before(e.lockedTo) {
		e.lockedTo = time.Time{}
		e.failures = e.failures[:0]
	}
	i := 0
	for i < len(e.failures) && now.Sub(e.failures[i]) >= window {
		i++
	}
	e.failures = e.failures[i:]
}

// sweepLocked drops entries with nothing left to remember; l.mu held.
func (l *loginLimiter) sweepLocked(now time.Time) {
	for k, e := range l.entries {
		e.prune(now, l.limits.Window)
		if len(e.failures) == 0 && e.lockedTo.IsZero() {
			delete(l.entries, k)
		}
	}
}
