package auth

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/postern-dev/postern/lib/api/authapi"
)

// LoginLimits bounds failed login attempts. The policy, in full:
//
//   - (user, address): MaxFailures failed logins for one user from one
//     source address within Window lock that user out *from that address
//     only*, for Window after the failure that reached the limit. The same
//     user from any other address is not affected.
//   - address: MaxAddrFailures failed logins from one source address (any
//     users) within Window lock the address out for every user, for Window.
//     This is what stops one address spraying many accounts.
//   - user (distributed guessing): once a user has MaxUserFailures failures
//     within Window from all addresses together, an address that has itself
//     failed for that user within Window is refused for that user until the
//     count falls below the limit again. An address with no failure for the
//     user is never refused on the user's account: the right password from a
//     clean address always reaches the password check, so nobody can lock a
//     user out by failing on purpose. An attacker spread over many addresses
//     gets one guess per address per Window instead of MaxFailures.
//
// IPv6 addresses count by /64, the smallest block a host is usually given.
// An attempt refused by a lock is not a failure of that lock, so hammering
// a lock does not prolong it; but one refused for a user's sake (the
// (user, address) lock or the per-user throttle) counts against the
// address, so an address that keeps guessing at a locked account soon
// locks itself out for every user. A successful login clears the (user, address) count of the
// address it came from; the address and user counts are kept (a valid
// account must not reset an attacker's budget). An admin clears every lock
// of a user, and optionally of one address, with `pctl users clear-lockout`
// (DELETE /v1/users/{name}/lockout). The counts live in the memory of each auth
// server: they reset when it restarts. With several auth processes on one
// etcd, each counts on its own, so the bound is per process: an attacker
// spreading guesses over N auth servers gets at most N times each limit per
// window (with the defaults and two servers, 10 guesses per (user, address)
// per 10 minutes), which still stops an online dictionary. Keeping the
// counts in memory is deliberate: a failed login costs no backend write, so
// a password spray cannot load etcd, and a backend outage does not turn
// into "every login locked" or "no login limited".
type LoginLimits struct {
	// MaxFailures per (user, address) within Window; zero means
	// DefaultMaxLoginFailures.
	MaxFailures int
	// MaxAddrFailures per address, all users together, within Window; zero
	// means DefaultMaxAddrFailures.
	MaxAddrFailures int
	// MaxUserFailures per user, all addresses together, within Window,
	// before addresses that failed for the user are refused; zero means
	// DefaultMaxUserFailures.
	MaxUserFailures int
	// Window is the counting window and the lockout; zero means
	// DefaultLoginWindow.
	Window time.Duration
}

const (
	// DefaultMaxLoginFailures tolerates a few typos, not a dictionary.
	DefaultMaxLoginFailures = 5
	// DefaultMaxAddrFailures is higher than the per-user limit: several
	// users behind one NAT share an address, and each may mistype.
	DefaultMaxAddrFailures = 20
	// DefaultMaxUserFailures: two addresses' worth of typos before the
	// per-user throttle starts.
	DefaultMaxUserFailures = 10
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
	if l.MaxAddrFailures <= 0 {
		l.MaxAddrFailures = DefaultMaxAddrFailures
	}
	if l.MaxUserFailures <= 0 {
		l.MaxUserFailures = DefaultMaxUserFailures
	}
	if l.Window <= 0 {
		l.Window = DefaultLoginWindow
	}
}

// loginLimiter counts failures per (user, address), per address and per
// user, and decides from them as LoginLimits describes.
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

// limiterKeys names the three counters of an attempt; a part is empty when
// user is empty (the join limiter counts addresses only).
type limiterKeys struct {
	userAddr, addr, user string
}

func keysFor(user, remoteAddr string) limiterKeys {
	if len(user) > maxLimiterKeyLen {
		user = user[:maxLimiterKeyLen]
	}
	host := addrKey(remoteAddr)
	k := limiterKeys{addr: "addr:" + host}
	if user != "" {
		// NUL cannot occur in a host, so user and address cannot be
		// shifted into each other.
		k.userAddr = "ua:" + host + "\x00" + user
		k.user = "user:" + user
	}
	return k
}

// addrKey is the address an attempt is counted under: the host without
// port, and for IPv6 its /64. An empty address (a caller that did not say)
// is one address of its own.
func addrKey(remoteAddr string) string {
	host := remoteAddr
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip := net.ParseIP(host); ip != nil {
		if ip.To4() == nil {
			return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
		}
		return ip.String()
	}
	if len(host) > maxLimiterKeyLen {
		host = host[:maxLimiterKeyLen]
	}
	return host
}

func errLocked(wait time.Duration) error {
	return authapi.RetryAfter(wait, fmt.Sprintf("too many failed login attempts; try again in %v", wait.Round(time.Second)))
}

// check refuses an attempt while the address, or the user from this
// address, is locked out, or while the user is under distributed attack and
// this address has failed for the user. An attempt refused for the user's
// sake counts as a failure of the address: an address that keeps guessing
// at a locked account locks itself out for everyone.
func (l *loginLimiter) check(user, remoteAddr string) error {
	now := l.clock.Now()
	k := keysFor(user, remoteAddr)
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.entries[k.addr]; e != nil {
		e.prune(now, l.limits.Window)
		if d := e.lockedTo.Sub(now); d > 0 {
			return errLocked(d)
		}
	}
	if k.user == "" {
		return nil
	}
	if wait := l.userWaitLocked(now, k); wait > 0 {
		l.countLocked(now, k.addr, l.limits.MaxAddrFailures)
		return errLocked(wait)
	}
	return nil
}

// userWaitLocked is how long user is refused from this address: the
// (user, address) lock, or the per-user throttle for an address that has
// failed for the user. Zero means not refused. l.mu held.
func (l *loginLimiter) userWaitLocked(now time.Time, k limiterKeys) time.Duration {
	ae := l.entries[k.userAddr]
	if ae == nil {
		// A clean address: never refused on the user's account.
		return 0
	}
	ae.prune(now, l.limits.Window)
	if d := ae.lockedTo.Sub(now); d > 0 {
		return d
	}
	ue := l.entries[k.user]
	if ue == nil || len(ae.failures) == 0 {
		return 0
	}
	ue.prune(now, l.limits.Window)
	if len(ue.failures) < l.limits.MaxUserFailures {
		return 0
	}
	// Refused until enough of the user's failures age out to go below the
	// limit, or this address's own failures do, whichever comes first.
	userWait := ue.failures[len(ue.failures)-l.limits.MaxUserFailures].Add(l.limits.Window).Sub(now)
	addrWait := ae.failures[len(ae.failures)-1].Add(l.limits.Window).Sub(now)
	return min(userWait, addrWait)
}

// failure records a failed attempt on every counter.
func (l *loginLimiter) failure(user, remoteAddr string) {
	now := l.clock.Now()
	k := keysFor(user, remoteAddr)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.countLocked(now, k.addr, l.limits.MaxAddrFailures)
	if k.user != "" {
		l.countLocked(now, k.userAddr, l.limits.MaxFailures)
		// The user count never locks by itself; check reads it.
		l.countLocked(now, k.user, 0)
	}
}

// countLocked adds a failure at key, locking it at lockAt failures (0:
// never); l.mu held.
func (l *loginLimiter) countLocked(now time.Time, key string, lockAt int) {
	e := l.entries[key]
	if e == nil {
		if len(l.entries) >= maxLimiterEntries {
			l.sweepLocked(now)
			if len(l.entries) >= maxLimiterEntries {
				return
			}
		}
		e = &limiterEntry{}
		l.entries[key] = e
	}
	e.prune(now, l.limits.Window)
	e.failures = append(e.failures, now)
	if lockAt > 0 && len(e.failures) >= lockAt {
		e.lockedTo = now.Add(l.limits.Window)
	}
}

// success clears the (user, address) count of a successful login. The
// address and user counts are kept: an attacker holding one valid account
// must not be able to reset their address's budget by logging in between
// guesses at other accounts, nor a real user's login reset an attacker's.
func (l *loginLimiter) success(user, remoteAddr string) {
	k := keysFor(user, remoteAddr)
	if k.userAddr == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.entries, k.userAddr)
}

// clear clears every count and lock of user (from every address) and,
// when remoteAddr is not empty, of that address. It reports how many
// entries it removed.
func (l *loginLimiter) clear(user, remoteAddr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	if remoteAddr != "" {
		if k := "addr:" + addrKey(remoteAddr); l.entries[k] != nil {
			delete(l.entries, k)
			n++
		}
	}
	if user == "" {
		return n
	}
	k := keysFor(user, "")
	suffix := "\x00" + strings.TrimPrefix(k.user, "user:")
	for key := range l.entries {
		if key == k.user || (strings.HasPrefix(key, "ua:") && strings.HasSuffix(key, suffix)) {
			delete(l.entries, key)
			n++
		}
	}
	return n
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
