// Package backend is Postern's storage contract: a small ordered key/value
// store with prefix ranges, per-item expiry and an ordered watch.
//
// Everything above it (services, auth, the NodeWatcher) is written against the
// Backend interface only, so the same code runs on the in-memory backend in
// tests, on the embedded SQLite file of a single-machine cluster and on etcd
// when one machine is not enough. The conformance suite in lib/backend/test is
// what makes that promise: every implementation must pass it unchanged.
//
// Keys are slash-separated strings ("/nodes/CLUSTER/UUID"). A range is always
// a prefix, never an arbitrary interval: prefixes are what the watch API and
// etcd both index natively, and nothing above needs more.
package backend

import (
	"context"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
)

// Item is one stored value.
type Item struct {
	// Key is the full key, starting with Separator.
	Key string
	// Value is the opaque payload (the services layer stores JSON).
	Value []byte
	// Expires, when not zero, is the moment after which the item no longer
	// exists: Get and GetRange stop returning it at once, and a delete event
	// is emitted once the backend sweeps it (promptly, but not necessarily at
	// the exact instant). Zero means the item never expires.
	Expires time.Time
	// Revision is set by the backend on every write and returned by reads; it
	// is opaque and only comparable for equality. Ignored on input.
	Revision int64
}

// OpType is the kind of a watch event.
type OpType int

const (
	// OpInit is the first event on every watcher: the watch is live, and any
	// write that happens from now on will be delivered. A reader that loads
	// the current state after OpInit therefore misses nothing (see the
	// NodeWatcher's start-up order).
	OpInit OpType = iota
	// OpPut is a create or an update; Event.Item holds the new value.
	OpPut
	// OpDelete is a delete or an expiry; Event.Item holds only the key.
	OpDelete
)

func (o OpType) String() string {
	switch o {
	case OpInit:
		return "init"
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	}
	return "unknown"
}

// Event is one change delivered by a Watcher.
type Event struct {
	Type OpType
	Item Item
}

// Watch says what a watcher wants to see.
type Watch struct {
	// Name is used in logs only.
	Name string
	// Prefixes limits events to keys under any of these prefixes; empty means
	// every key.
	Prefixes []string
	// QueueSize is the capacity of the events channel; zero means
	// DefaultWatchQueueSize. A watcher whose reader falls so far behind that
	// the queue fills is closed (Done fires, Error says why) rather than
	// blocking writers or silently dropping events: the reader re-syncs.
	QueueSize int
}

// DefaultWatchQueueSize is large enough to absorb a burst of heartbeats from
// a few thousand nodes while the reader is busy, small enough that a stuck
// reader is detected quickly instead of pinning memory.
const DefaultWatchQueueSize = 1024

// Watcher delivers events in the order the writes were committed.
type Watcher interface {
	// Events delivers OpInit first, then puts and deletes in commit order.
	Events() <-chan Event
	// Done is closed when the watcher stops, by Close or because it broke.
	Done() <-chan struct{}
	// Error tells why a watcher that was not closed by its owner stopped.
	Error() error
	// Close stops the watcher; it is safe to call more than once.
	Close() error
}

// Backend is the storage contract. All methods are safe for concurrent use.
//
// Errors are classified with trace: NotFound for a missing key,
// AlreadyExists from Create, CompareFailed from CompareAndSwap,
// BadParameter for a malformed key or item, ConnectionProblem when the store
// itself cannot be reached.
type Backend interface {
	// Get returns the item at key.
	Get(ctx context.Context, key string) (*Item, error)
	// GetRange returns the items whose keys start with prefix, sorted by
	// key. limit <= 0 means no limit.
	GetRange(ctx context.Context, prefix string, limit int) ([]Item, error)
	// Put creates or replaces an item and returns it with its new Revision.
	Put(ctx context.Context, item Item) (*Item, error)
	// Create writes an item only if its key does not exist yet.
	Create(ctx context.Context, item Item) (*Item, error)
	// CompareAndSwap replaces expected with replaceWith only if the stored
	// value at expected.Key equals expected.Value (byte for byte).
	CompareAndSwap(ctx context.Context, expected Item, replaceWith Item) (*Item, error)
	// Delete removes key; NotFound if it is not there.
	Delete(ctx context.Context, key string) error
	// DeleteRange removes every key under prefix.
	DeleteRange(ctx context.Context, prefix string) error
	// NewWatcher starts a watch; the first event is OpInit.
	NewWatcher(ctx context.Context, watch Watch) (Watcher, error)
	// Clock is the clock the backend uses for expiry.
	Clock() clockwork.Clock
	// Close releases the backend. Watchers are closed.
	Close() error
}

// Separator separates key components.
const Separator = "/"

// Key joins components into a key: Key("nodes", "c1", "u1") = "/nodes/c1/u1".
func Key(parts ...string) string {
	return Separator + strings.Join(parts, Separator)
}

// Prefix is Key with a trailing separator, so that Prefix("nodes","c1")
// does not also match "/nodes/c10/...".
func Prefix(parts ...string) string {
	return Key(parts...) + Separator
}

// CheckItem validates an item on its way in.
func CheckItem(item Item) error {
	if err := CheckKey(item.Key); err != nil {
		return trace.Wrap(err)
	}
	return nil
}

// CheckKey validates a key: non-empty, starting with Separator, no NUL bytes
// (SQLite and etcd both accept them, but nothing legitimate produces one and
// they make log lines lie).
func CheckKey(key string) error {
	if key == "" || !strings.HasPrefix(key, Separator) {
		return trace.BadParameter("backend key %q must start with %q", key, Separator)
	}
	if strings.ContainsRune(key, 0) {
		return trace.BadParameter("backend key %q contains a NUL byte", key)
	}
	return nil
}

// Expired reports whether item has expired at now.
func (i Item) Expired(now time.Time) bool {
	return !i.Expires.IsZero() && !now.Before(i.Expires)
}

// MatchesAny reports whether key is under any of prefixes (all keys when
// prefixes is empty).
func MatchesAny(key string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// BatchCreator is a backend that writes many new items in one round trip
// (SQLite: one transaction, one fsync). Writers of many small independent
// items, like the audit log, use it through CreateMany.
type BatchCreator interface {
	// CreateMany writes, all or nothing, every item whose key does not
	// exist yet and skips the others (a key that exists is not an error:
	// the item was written before); it returns how many it wrote.
	CreateMany(ctx context.Context, items []Item) (int, error)
}

// CreateMany writes items through b's CreateMany when it has one, else one
// Create at a time (then not all or nothing: the items before an error
// stay written).
func CreateMany(ctx context.Context, b Backend, items []Item) (int, error) {
	if bc, ok := b.(BatchCreator); ok {
		n, err := bc.CreateMany(ctx, items)
		return n, trace.Wrap(err)
	}
	n := 0
	for _, it := range items {
		_, err := b.Create(ctx, it)
		if trace.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return n, trace.Wrap(err)
		}
		n++
	}
	return n, nil
}
