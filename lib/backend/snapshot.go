package backend

import (
	"context"

	"github.com/gravitational/trace"
)

// Snapshotter is a backend that can read every live item as of one moment
// while writes go on, streaming the items instead of loading them all:
// what a backup of a serving cluster needs. SQLite reads in one read
// transaction (WAL lets it run beside the writer and it sees the database
// as of its start); etcd reads every page at the first page's revision.
type Snapshotter interface {
	// Snapshot calls fn for each live item, in key order, as of a single
	// moment. An error from fn stops the read and is returned.
	Snapshot(ctx context.Context, fn func(Item) error) error
}

// Snapshot reads every live item of b as of one moment (see Snapshotter).
// A backend without a streaming snapshot is read with one GetRange, which
// every backend answers from one consistent view.
func Snapshot(ctx context.Context, b Backend, fn func(Item) error) error {
	if s, ok := b.(Snapshotter); ok {
		return trace.Wrap(s.Snapshot(ctx, fn))
	}
	items, err := b.GetRange(ctx, Separator, 0)
	if err != nil {
		return trace.Wrap(err)
	}
	for _, it := range items {
		if err := fn(it); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}
