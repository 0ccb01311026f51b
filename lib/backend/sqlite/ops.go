package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"sort"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// Every read filters on "live": a row whose expiry has passed is gone as far
// as callers are concerned, whether or not the sweeper has run yet.
const live = "(expires = 0 OR expires > ?)"

func (b *Backend) now() int64 { return b.cfg.Clock.Now().UnixNano() }

func (b *Backend) checkOpen() error {
	if b.readClosed.Load() {
		return errClosed()
	}
	return nil
}

func errClosed() error {
	return trace.ConnectionProblem(nil, "sqlite backend is closed")
}

func toNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Get implements Backend.
func (b *Backend) Get(ctx context.Context, key string) (*backend.Item, error) {
	if err := backend.CheckKey(key); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	it := backend.Item{Key: key}
	var expires int64
	err := b.reader.QueryRowContext(ctx,
		"SELECT value, expires, revision FROM kv WHERE key = ? AND "+live, key, b.now()).
		Scan(&it.Value, &expires, &it.Revision)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, trace.NotFound("key %q is not found", key)
	}
	if err != nil {
		return nil, convertError(err)
	}
	it.Expires = fromNanos(expires)
	return &it, nil
}

// GetRange implements Backend.
func (b *Backend) GetRange(ctx context.Context, prefix string, limit int) ([]backend.Item, error) {
	if err := backend.CheckKey(prefix); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	query := "SELECT key, value, expires, revision FROM kv WHERE key >= ? AND " + live
	args := []any{prefix, b.now()}
	if end := backend.RangeEnd(prefix); end != "" {
		query += " AND key < ?"
		args = append(args, end)
	}
	query += " ORDER BY key"
	if limit > 0 {
		query += " LIMIT ?"
		args = append(args, limit)
	}
	rows, err := b.reader.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, convertError(err)
	}
	defer rows.Close()
	var out []backend.Item
	for rows.Next() {
		var it backend.Item
		var expires int64
		if err := rows.Scan(&it.Key, &it.Value, &expires, &it.Revision); err != nil {
			return nil, convertError(err)
		}
		it.Expires = fromNanos(expires)
		out = append(out, it)
	}
	return out, convertError(rows.Err())
}

// The write path's statements (prepared once in init).
const (
	upsertQuery = "INSERT INTO kv(key, value, expires, revision) VALUES (?, ?, ?, ?) " +
		"ON CONFLICT(key) DO UPDATE SET value = excluded.value, expires = excluded.expires, revision = excluded.revision"
	bumpQuery   = "UPDATE meta SET value = ? WHERE name = 'revision'"
	existsQuery = "SELECT COUNT(*) FROM kv WHERE key = ? AND " + live
)

// writeLocked upserts item inside tx with the next revision, returning the
// stored item. The caller commits, then calls committedLocked.
func (b *Backend) writeLocked(ctx context.Context, tx *sql.Tx, item backend.Item) (backend.Item, error) {
	stored, err := b.upsertLocked(ctx, tx, item, b.rev+1)
	if err != nil {
		return backend.Item{}, trace.Wrap(err)
	}
	if err := b.bumpRevision(ctx, tx, stored.Revision); err != nil {
		return backend.Item{}, trace.Wrap(err)
	}
	return stored, nil
}

// upsertLocked writes item at revision rev inside tx (without recording
// rev in the meta table: the caller does, once per transaction).
func (b *Backend) upsertLocked(ctx context.Context, tx *sql.Tx, item backend.Item, rev int64) (backend.Item, error) {
	value := item.Value
	if value == nil {
		value = []byte{} // value is NOT NULL: an empty value is still a value
	}
	expires := toNanos(item.Expires)
	if _, err := tx.StmtContext(ctx, b.upsertStmt).ExecContext(ctx, item.Key, value, expires, rev); err != nil {
		return backend.Item{}, trace.Wrap(err)
	}
	return backend.Item{Key: item.Key, Value: bytes.Clone(value), Expires: fromNanos(expires), Revision: rev}, nil
}

func (b *Backend) bumpRevision(ctx context.Context, tx *sql.Tx, rev int64) error {
	_, err := tx.StmtContext(ctx, b.bumpStmt).ExecContext(ctx, rev)
	return trace.Wrap(err)
}

// existsLocked says whether a live item is stored at key.
func (b *Backend) existsLocked(ctx context.Context, tx *sql.Tx, key string) (bool, error) {
	var n int
	if err := tx.StmtContext(ctx, b.existsStmt).QueryRowContext(ctx, key, b.now()).Scan(&n); err != nil {
		return false, trace.Wrap(err)
	}
	return n > 0, nil
}

// CreateMany implements backend.BatchCreator: one transaction, so one
// fsync, for the whole batch. The audit log writes every event with it:
// one transaction per event was the largest part of an auth+proxy
// process's CPU per SSH connection.
func (b *Backend) CreateMany(ctx context.Context, items []backend.Item) (int, error) {
	for _, it := range items {
		if err := backend.CheckItem(it); err != nil {
			return 0, trace.Wrap(err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errClosed()
	}
	var stored []backend.Item
	err := b.txLocked(ctx, func(tx *sql.Tx) error {
		stored = stored[:0]
		seen := make(map[string]bool, len(items))
		rev := b.rev
		for _, it := range items {
			if seen[it.Key] {
				continue
			}
			seen[it.Key] = true
			exists, err := b.existsLocked(ctx, tx, it.Key)
			if err != nil {
				return err
			}
			if exists {
				continue
			}
			rev++
			s, err := b.upsertLocked(ctx, tx, it, rev)
			if err != nil {
				return err
			}
			stored = append(stored, s)
		}
		if len(stored) == 0 {
			return nil
		}
		return b.bumpRevision(ctx, tx, rev)
	})
	if err != nil {
		return 0, err
	}
	for _, s := range stored {
		b.putCommittedLocked(s)
	}
	return len(stored), nil
}

// putCommittedLocked records a committed put: advances the revision, arms
// expiry and fans the event out.
func (b *Backend) putCommittedLocked(it backend.Item) *backend.Item {
	b.rev = it.Revision
	if !it.Expires.IsZero() {
		b.armLocked(it.Expires)
	}
	ev := it
	ev.Value = bytes.Clone(it.Value)
	b.fanout.Emit(backend.Event{Type: backend.OpPut, Item: ev})
	return &it
}

// Put implements Backend.
func (b *Backend) Put(ctx context.Context, item backend.Item) (*backend.Item, error) {
	return b.write(ctx, item, nil)
}

// Create implements Backend.
func (b *Backend) Create(ctx context.Context, item backend.Item) (*backend.Item, error) {
	return b.write(ctx, item, func(ctx context.Context, tx *sql.Tx) error {
		exists, err := b.existsLocked(ctx, tx, item.Key)
		if err != nil {
			return trace.Wrap(err)
		}
		if exists {
			return trace.AlreadyExists("key %q already exists", item.Key)
		}
		return nil
	})
}

// CompareAndSwap implements Backend.
func (b *Backend) CompareAndSwap(ctx context.Context, expected, replaceWith backend.Item) (*backend.Item, error) {
	if err := backend.CheckItem(expected); err != nil {
		return nil, trace.Wrap(err)
	}
	if expected.Key != replaceWith.Key {
		return nil, trace.BadParameter("compare and swap keys differ: %q and %q", expected.Key, replaceWith.Key)
	}
	return b.write(ctx, replaceWith, func(ctx context.Context, tx *sql.Tx) error {
		var value []byte
		err := tx.QueryRowContext(ctx, "SELECT value FROM kv WHERE key = ? AND "+live, expected.Key, b.now()).Scan(&value)
		if errors.Is(err, sql.ErrNoRows) {
			return trace.CompareFailed("key %q is not found", expected.Key)
		}
		if err != nil {
			return trace.Wrap(err)
		}
		if !bytes.Equal(value, expected.Value) {
			return trace.CompareFailed("value of key %q has changed", expected.Key)
		}
		return nil
	})
}

// write is the shared body of Put, Create and CompareAndSwap: check (when
// given) and upsert in one transaction, then publish.
func (b *Backend) write(ctx context.Context, item backend.Item, check func(context.Context, *sql.Tx) error) (*backend.Item, error) {
	if err := backend.CheckItem(item); err != nil {
		return nil, trace.Wrap(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errClosed()
	}
	var stored backend.Item
	err := b.txLocked(ctx, func(tx *sql.Tx) error {
		if check != nil {
			if err := check(ctx, tx); err != nil {
				return err
			}
		}
		var err error
		stored, err = b.writeLocked(ctx, tx, item)
		return err
	})
	if err != nil {
		return nil, err
	}
	return b.putCommittedLocked(stored), nil
}

// Delete implements Backend.
func (b *Backend) Delete(ctx context.Context, key string) error {
	if err := backend.CheckKey(key); err != nil {
		return trace.Wrap(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed()
	}
	err := b.txLocked(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM kv WHERE key = ? AND "+live, key, b.now())
		if err != nil {
			return trace.Wrap(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return trace.Wrap(err)
		}
		if n == 0 {
			return trace.NotFound("key %q is not found", key)
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.fanout.Emit(backend.Event{Type: backend.OpDelete, Item: backend.Item{Key: key}})
	return nil
}

// DeleteRange implements Backend.
func (b *Backend) DeleteRange(ctx context.Context, prefix string) error {
	if err := backend.CheckKey(prefix); err != nil {
		return trace.Wrap(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed()
	}
	now := b.now()
	var events []backend.Event
	err := b.txLocked(ctx, func(tx *sql.Tx) error {
		query := "DELETE FROM kv WHERE key >= ?"
		args := []any{prefix}
		if end := backend.RangeEnd(prefix); end != "" {
			query += " AND key < ?"
			args = append(args, end)
		}
		rows, err := tx.QueryContext(ctx, query+" RETURNING key, expires", args...)
		if err != nil {
			return trace.Wrap(err)
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			var expires int64
			if err := rows.Scan(&key, &expires); err != nil {
				return trace.Wrap(err)
			}
			// Rows already expired were invisible: no event for them.
			if expires == 0 || expires > now {
				events = append(events, backend.Event{Type: backend.OpDelete, Item: backend.Item{Key: key}})
			}
		}
		return trace.Wrap(rows.Err())
	})
	if err != nil {
		return err
	}
	sortEvents(events)
	b.fanout.Emit(events...)
	return nil
}

// NewWatcher implements Backend. Registration happens under the write lock,
// so every commit after it returns is delivered, as OpInit promises.
func (b *Backend) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errClosed()
	}
	w, err := b.fanout.NewWatcher(ctx, watch)
	return w, trace.Wrap(err)
}

func sortEvents(events []backend.Event) {
	sort.Slice(events, func(i, j int) bool { return events[i].Item.Key < events[j].Item.Key })
}
