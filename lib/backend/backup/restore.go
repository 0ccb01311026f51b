package backup

import (
	"context"
	"io"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// restoreBatch is how many items one CreateMany writes: on SQLite one
// transaction and one fsync per batch instead of per item.
const restoreBatch = 256

// Restore writes every item of r into dst, which must be empty: a restore
// never merges into live data, where a stale CA or user would silently win
// or lose. Items that have expired since the backup are skipped (node
// heartbeats, sessions); the others keep their expiry. On error the items
// already written are removed again, so dst is left empty as it was found.
// It returns the number of items written.
func Restore(ctx context.Context, r *Reader, dst backend.Backend) (int, error) {
	some, err := dst.GetRange(ctx, backend.Separator, 1)
	if err != nil {
		return 0, trace.Wrap(err)
	}
	if len(some) > 0 {
		return 0, trace.AlreadyExists("the destination backend is not empty (it holds %s): restore into an empty one", some[0].Key)
	}
	n, err := restore(ctx, r, dst)
	if err != nil {
		if derr := dst.DeleteRange(context.WithoutCancel(ctx), backend.Separator); derr != nil {
			return 0, trace.NewAggregate(err, trace.Wrap(derr, "removing the partly restored items"))
		}
		return 0, trace.Wrap(err)
	}
	return n, nil
}

func restore(ctx context.Context, r *Reader, dst backend.Backend) (int, error) {
	now := dst.Clock().Now()
	batch := make([]backend.Item, 0, restoreBatch)
	n := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		wrote, err := backend.CreateMany(ctx, dst, batch)
		if err != nil {
			return trace.Wrap(err)
		}
		if wrote != len(batch) {
			return trace.BadParameter("the backup holds a key twice (%d of %d items written)", wrote, len(batch))
		}
		n += wrote
		batch = batch[:0]
		return nil
	}
	for {
		it, err := r.Next()
		if err == io.EOF {
			return n, trace.Wrap(flush())
		}
		if err != nil {
			return 0, trace.Wrap(err)
		}
		if it.Expired(now) {
			continue
		}
		batch = append(batch, it)
		if len(batch) == restoreBatch {
			if err := flush(); err != nil {
				return 0, trace.Wrap(err)
			}
		}
	}
}
