package etcdbk

import (
	"context"

	"github.com/gravitational/trace"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/lib/backend"
)

var _ backend.Snapshotter = (*Backend)(nil)

// Snapshot implements backend.Snapshotter: every key under the prefix, read
// page by page at the revision of the first page, so the result is the
// prefix as of one revision however long the reader takes. Each page has
// its own RequestTimeout (a big backup is many pages, not one call); a
// revision compacted away meanwhile fails the read with etcd's error.
func (b *Backend) Snapshot(ctx context.Context, fn func(backend.Item) error) error {
	if err := b.checkOpen(); err != nil {
		return err
	}
	start := b.etcdKey(backend.Separator)
	end := clientv3.GetPrefixRangeEnd(start)
	now := b.cfg.Clock.Now()
	var rev int64
	for {
		opts := []clientv3.OpOption{
			clientv3.WithRange(end),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend),
			clientv3.WithLimit(rangePageSize),
		}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		pctx, cancel := b.withTimeout(ctx)
		resp, err := b.client.Get(pctx, start, opts...)
		cancel()
		if err != nil {
			return b.convertError(err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			it, err := decode(b.userKey(kv.Key), kv.Value)
			if err != nil {
				return trace.Wrap(err)
			}
			if it.Expired(now) {
				continue
			}
			it.Revision = kv.ModRevision
			if err := fn(it); err != nil {
				return trace.Wrap(err)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
