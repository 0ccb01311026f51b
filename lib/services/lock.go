package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
)

// A lock cuts access now, whatever certificates or web sessions the target
// still holds: certificates live for hours and cannot be recalled, so every
// proxy and node keeps the cluster's locks in memory (a LockWatcher fed by
// backend events) and refuses, and ends, what a lock covers. Deleting a user
// writes a lock too (see auth's DeleteUser), so "deleted" and "locked" are
// one mechanism, enforced in one place per server.

// KindLock is the kind of a lock resource.
const KindLock = "lock"

const locksPrefix = "locks"

// Lock target kinds: the second component of a lock's backend key.
const (
	LockTargetUser = "user"
	LockTargetNode = "node"
	// LockTargetAccessRequest locks the roles an access request granted
	// (auth writes it when the request is denied or expires).
	LockTargetAccessRequest = "access_request"
)

// maxLockMessageLen bounds a lock's message: it is shown to users on their
// terminals and in SSH banners, one line of explanation, not a document.
const maxLockMessageLen = 256

// LockTarget is what a lock covers: exactly one of User or Node.
type LockTarget struct {
	// User is a Postern user name.
	User string `json:"user,omitempty"`
	// Node is a node's UUID: a hostname is chosen by the node itself and
	// may be shared, a UUID is what the host certificate names.
	Node string `json:"node,omitempty"`
	// AccessRequest is an access request's id: it ends the certificates
	// (connections, web sessions) that carry the request's roles.
	AccessRequest string `json:"access_request,omitempty"`
}

// String is the target as pctl and logs name it: `user "alice"`.
func (t LockTarget) String() string {
	if t.Node != "" {
		return "node " + quote(t.Node)
	}
	if t.AccessRequest != "" {
		return "access request " + quote(t.AccessRequest)
	}
	return "user " + quote(t.User)
}

// Check validates the target.
func (t LockTarget) Check() error {
	n := 0
	for _, v := range []string{t.User, t.Node, t.AccessRequest} {
		if v != "" {
			n++
		}
	}
	switch {
	case t.User != "" && t.Node != "":
		return trace.BadParameter("lock target names both a user and a node: lock one at a time")
	case n > 1:
		return trace.BadParameter("lock target names more than one of a user, a node and an access request: lock one at a time")
	case t.AccessRequest != "":
		return trace.Wrap(CheckRequestID(t.AccessRequest))
	case t.User != "":
		return trace.Wrap(CheckUserName(t.User))
	case t.Node != "":
		return trace.Wrap(checkKeyComponent("node uuid", t.Node))
	}
	return trace.BadParameter("lock target is empty: name a user or a node")
}

// kindAndName are the key components of the target.
func (t LockTarget) kindAndName() (string, string) {
	if t.Node != "" {
		return LockTargetNode, t.Node
	}
	if t.AccessRequest != "" {
		return LockTargetAccessRequest, t.AccessRequest
	}
	return LockTargetUser, t.User
}

// LockKey is the backend key of the lock on t: /locks/user/NAME or
// /locks/node/UUID. One lock per target: locking again replaces it.
func LockKey(t LockTarget) string {
	kind, name := t.kindAndName()
	return backend.Key(locksPrefix, kind, name)
}

// LocksPrefix is the prefix of every lock key.
func LocksPrefix() string { return backend.Prefix(locksPrefix) }

// ParseLockTarget turns a target's (kind, name) pair, as in the API path,
// back into a LockTarget.
func ParseLockTarget(kind, name string) (LockTarget, error) {
	var t LockTarget
	switch kind {
	case LockTargetUser:
		t.User = name
	case LockTargetNode:
		t.Node = name
	case LockTargetAccessRequest:
		t.AccessRequest = name
	default:
		return t, trace.BadParameter("unknown lock target kind %q: want %q, %q or %q", kind, LockTargetUser, LockTargetNode, LockTargetAccessRequest)
	}
	return t, trace.Wrap(t.Check())
}

// Lock refuses and ends access of its target until it is removed or
// expires.
type Lock struct {
	Target LockTarget `json:"target"`
	// Message is shown to the locked-out user; may be empty.
	Message string `json:"message,omitempty"`
	// Expires, when set, lifts the lock by itself: the backend item
	// expires with it. Zero means until `pctl unlock`.
	Expires time.Time `json:"expires,omitzero"`
	// CreatedBy is the identity that wrote the lock (an admin's or the
	// auth server's).
	CreatedBy string `json:"created_by,omitempty"`
	// Created is when the lock was written.
	Created time.Time `json:"created"`
}

// CheckAndSetDefaults validates a lock.
func (l *Lock) CheckAndSetDefaults() error {
	if err := l.Target.Check(); err != nil {
		return trace.Wrap(err)
	}
	if len(l.Message) > maxLockMessageLen {
		return trace.BadParameter("lock message is longer than %d characters", maxLockMessageLen)
	}
	for _, r := range l.Message {
		// The message lands on users' terminals: an escape sequence in it
		// could rewrite what they see.
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return trace.BadParameter("lock message contains the control character %q", r)
		}
	}
	return nil
}

// IsExpired reports whether the lock no longer applies at now.
func (l *Lock) IsExpired(now time.Time) bool {
	return !l.Expires.IsZero() && !now.Before(l.Expires)
}

// Refusal is what the locked-out user is told.
func (l *Lock) Refusal() string {
	var b strings.Builder
	if l.Target.Node != "" {
		fmt.Fprintf(&b, "postern: node %s is locked", l.Target.Node)
	} else if l.Target.AccessRequest != "" {
		fmt.Fprintf(&b, "postern: the roles of access request %s ended (log in again for your own roles)", l.Target.AccessRequest)
	} else {
		fmt.Fprintf(&b, "postern: access for user %s is locked", l.Target.User)
	}
	if l.Message != "" {
		b.WriteString(": ")
		b.WriteString(l.Message)
	}
	return b.String()
}

// LockedError is the refusal of something a lock covers. It is not a
// trace.AccessDeniedError on purpose: the paths that answer a denied node
// with "not found" (so as not to confirm what a user may not see) must pass
// this one on, because the user may see the node and must learn why it
// refuses them.
type LockedError struct {
	Lock Lock
	// Message, when set, is the refusal as another process worded it (an
	// error read back from the auth API carries no Lock).
	Message string
}

func (e *LockedError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return e.Lock.Refusal()
}

// LockDenied is the refusal of a certificate (a login) to a locked user:
// an access denial, as every refused certificate is, that is also a
// LockedError, so that a login that proved its password can say that
// access is locked and why instead of "invalid credentials". Only the auth
// server makes it, and only after the password and second factor were
// checked: a caller without them never learns that a user is locked.
func LockDenied(msg string) error {
	return &lockDenied{
		denied: &trace.AccessDeniedError{Message: msg},
		locked: &LockedError{Message: msg},
	}
}

type lockDenied struct {
	denied *trace.AccessDeniedError
	locked *LockedError
}

func (e *lockDenied) Error() string { return e.locked.Error() }

// Unwrap lets errors.As find either half (trace.IsAccessDenied and
// IsLocked are both true).
func (e *lockDenied) Unwrap() []error { return []error{e.denied, e.locked} }

// IsLocked reports whether err is (or wraps) a LockedError.
func IsLocked(err error) bool {
	var le *LockedError
	return errors.As(err, &le)
}

// UpsertLock writes a lock; the backend item expires with the lock.
func (s *Store) UpsertLock(ctx context.Context, l Lock) error {
	if err := l.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, LockKey(l.Target), l, l.Expires)
}

// GetLock returns the lock on t.
func (s *Store) GetLock(ctx context.Context, t LockTarget) (*Lock, error) {
	if err := t.Check(); err != nil {
		return nil, trace.NotFound("no lock on %s", t)
	}
	var l Lock
	if err := s.get(ctx, LockKey(t), &l, "no lock on "+t.String()); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetLocks returns every lock in force. Unreadable records are logged and
// skipped: one bad record must not stop every proxy and node from loading
// the others.
func (s *Store) GetLocks(ctx context.Context) ([]Lock, error) {
	return getAllSkipping[Lock](ctx, s, LocksPrefix(), true)
}

// DeleteLock lifts the lock on t.
func (s *Store) DeleteLock(ctx context.Context, t LockTarget) error {
	if err := t.Check(); err != nil {
		return trace.NotFound("no lock on %s", t)
	}
	return s.delete(ctx, LockKey(t), "no lock on "+t.String())
}

// LockEvents is what a LockWatcher consumes: a watch of the locks prefix
// and a read of every lock. *Store provides it, and so does the auth
// client's LockEvents for a process whose auth server is elsewhere.
type LockEvents interface {
	NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error)
	GetLocks(ctx context.Context) ([]Lock, error)
}

var _ LockEvents = (*Store)(nil)

// LockWatcherConfig configures a LockWatcher.
type LockWatcherConfig struct {
	// Events is read and watched. Required.
	Events LockEvents
	// Clock decides expiry and drives re-sync backoff; nil means the real
	// clock.
	Clock clockwork.Clock
	// Logger; nil means logrus with component "watcher:locks".
	Logger logrus.FieldLogger
	// MaxStale, when positive, bounds how long Check answers from the
	// last lock set after a watch that was live broke: past it, Check
	// refuses everyone (a ConnectionProblem) until the watch is back, as
	// before the first load. The last set keeps denying what it locks
	// either way. Zero keeps answering from the last set without bound:
	// the set can only lack the locks written while this process could
	// not see them. See the comment atop stale.go.
	MaxStale time.Duration
}

// LockWatcher serves the cluster's locks from memory. Servers ask it on
// every connection and channel (a map lookup, never a backend round trip)
// and wait on Changes to end what a new lock covers.
type LockWatcher struct {
	w     *ResourceWatcher[Lock]
	c     *lockCollector
	clock clockwork.Clock
	// stale decides and counts answers from a broken watch (MaxStale).
	stale *staleness
}

// NewLockWatcher starts the watcher; stop it with Close.
func NewLockWatcher(cfg LockWatcherConfig) (*LockWatcher, error) {
	if cfg.Events == nil {
		return nil, trace.BadParameter("lock watcher: missing Events")
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.WithField("component", "watcher:locks")
	}
	maxStale := cfg.MaxStale
	if maxStale <= 0 {
		maxStale = -1 // no bound
	}
	c := newLockCollector()
	rw, err := NewResourceWatcher(ResourceWatcherConfig[Lock]{
		Name:      "locks",
		Source:    cfg.Events,
		Prefixes:  []string{LocksPrefix()},
		Load:      cfg.Events.GetLocks,
		Unmarshal: unmarshalLock,
		Collector: c,
		Clock:     cfg.Clock,
		Logger:    cfg.Logger,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &LockWatcher{w: rw, c: c, clock: cfg.Clock,
		stale: &staleness{view: "locks", max: maxStale, clock: cfg.Clock, log: cfg.Logger}}, nil
}

func unmarshalLock(item backend.Item) (Lock, error) {
	var l Lock
	if err := json.Unmarshal(item.Value, &l); err != nil {
		return l, trace.BadParameter("lock at %q: %v", item.Key, err)
	}
	if err := l.CheckAndSetDefaults(); err != nil {
		return l, trace.Wrap(err)
	}
	if LockKey(l.Target) != item.Key {
		return l, trace.BadParameter("lock at %q names %s", item.Key, l.Target)
	}
	return l, nil
}

// errLocksNotLoaded refuses while the lock set was never loaded: access
// is denied by default, and an unknown lock set may hold a lock on anyone.
var errLocksNotLoaded = trace.ConnectionProblem(nil, "the auth server's lock list is not loaded yet; try again in a moment")

// Check returns a *LockedError for the first lock in force on any of
// targets (empty fields are skipped), nil when none is, and a
// ConnectionProblem before the first load. After a load, a broken watch
// keeps the last set, whose locks keep denying; a lock that arrives while
// the watch is down applies once it re-syncs, and past MaxStale nothing
// but a ConnectionProblem is answered until then.
func (l *LockWatcher) Check(targets ...LockTarget) error {
	select {
	case <-l.w.Synced():
	default:
		return errLocksNotLoaded
	}
	if err := l.checkSet(targets); err != nil {
		return err
	}
	return trace.Wrap(l.stale.check(l.w.state()))
}

func (l *LockWatcher) checkSet(targets []LockTarget) error {
	now := l.clock.Now()
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	for _, t := range targets {
		if t.User == "" && t.Node == "" && t.AccessRequest == "" {
			continue
		}
		if lk, ok := l.c.locks[LockKey(t)]; ok && !lk.IsExpired(now) {
			return &LockedError{Lock: lk}
		}
	}
	return nil
}

// StaleStats reports the answers given from the last set while the watch
// was broken, and how long it has not been current.
func (l *LockWatcher) StaleStats() StaleStats {
	at, _ := l.w.state()
	return l.stale.stats(at)
}

// Changes returns a channel closed at the next change of the lock set.
// Take it before checking, so a change between the check and the wait is
// not missed.
func (l *LockWatcher) Changes() <-chan struct{} {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.c.changed
}

// Locks returns the locks in force, sorted by key.
func (l *LockWatcher) Locks() []Lock {
	now := l.clock.Now()
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	keys := make([]string, 0, len(l.c.locks))
	for k, lk := range l.c.locks {
		if !lk.IsExpired(now) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]Lock, 0, len(keys))
	for _, k := range keys {
		out = append(out, l.c.locks[k])
	}
	return out
}

// WaitSynced blocks until the first load, ctx's end or Close.
func (l *LockWatcher) WaitSynced(ctx context.Context) error { return l.w.WaitSynced(ctx) }

// Healthy is nil while the watch is live.
func (l *LockWatcher) Healthy() error { return l.w.Healthy() }

// Close stops the watcher.
func (l *LockWatcher) Close() error { return l.w.Close() }

// Done is closed once the watcher has stopped.
func (l *LockWatcher) Done() <-chan struct{} { return l.w.Done() }

// lockCollector holds the locks by backend key and announces every change
// by closing changed and replacing it.
type lockCollector struct {
	// mu guards locks and changed.
	mu      sync.Mutex
	locks   map[string]Lock
	changed chan struct{}
}

func newLockCollector() *lockCollector {
	return &lockCollector{locks: map[string]Lock{}, changed: make(chan struct{})}
}

// notifyLocked wakes every waiter; mu must be held.
func (c *lockCollector) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *lockCollector) Reset(items []Lock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.locks = make(map[string]Lock, len(items))
	for _, l := range items {
		c.locks[LockKey(l.Target)] = l
	}
	c.notifyLocked()
}

func (c *lockCollector) Put(l Lock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.locks[LockKey(l.Target)] = l
	c.notifyLocked()
}

func (c *lockCollector) Delete(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.locks, key)
	c.notifyLocked()
}
