package sqlite

import (
	"context"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

var _ backend.Snapshotter = (*Backend)(nil)

// Snapshot implements backend.Snapshotter with one SELECT streamed row by
// row. In WAL mode one statement is one read transaction: it sees the
// database as of its first step, whatever the writer commits meanwhile, and
// does not block the writer (the WAL only grows until the read ends). This
// is the consistency VACUUM INTO or the backup API would give, without
// producing a SQLite file: a backup is backend-neutral (lib/backend/backup).
func (b *Backend) Snapshot(ctx context.Context, fn func(backend.Item) error) error {
	if err := b.checkOpen(); err != nil {
		return err
	}
	rows, err := b.reader.QueryContext(ctx,
		"SELECT key, value, expires, revision FROM kv WHERE "+live+" ORDER BY key", b.now())
	if err != nil {
		return convertError(err)
	}
	defer rows.Close()
	for rows.Next() {
		var it backend.Item
		var expires int64
		if err := rows.Scan(&it.Key, &it.Value, &expires, &it.Revision); err != nil {
			return convertError(err)
		}
		it.Expires = fromNanos(expires)
		if err := fn(it); err != nil {
			return trace.Wrap(err)
		}
	}
	return convertError(rows.Err())
}
