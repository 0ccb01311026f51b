package etcdbk

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/gravitational/trace"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/lib/backend"
)

// rangePageSize bounds one range read, so that listing every node of a big
// cluster does not become one huge gRPC message.
const rangePageSize = 1000

// current reads key and returns the live item with its ModRevision, or
// (nil, modRevision) when it is missing or expired. The mod revision (0 when
// the key is absent from etcd) is what a following transaction compares
// against, so an expired-but-not-yet-revoked item can be overwritten
// safely.
func (b *Backend) current(ctx context.Context, key string) (*backend.Item, int64, error) {
	resp, err := b.client.Get(ctx, b.etcdKey(key))
	if err != nil {
		return nil, 0, b.convertError(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	kv := resp.Kvs[0]
	it, err := decode(key, kv.Value)
	if err != nil {
		return nil, 0, trace.Wrap(err)
	}
	if it.Expired(b.cfg.Clock.Now()) {
		return nil, kv.ModRevision, nil
	}
	it.Revision = kv.ModRevision
	return &it, kv.ModRevision, nil
}

// Get implements Backend.
func (b *Backend) Get(ctx context.Context, key string) (*backend.Item, error) {
	if err := backend.CheckKey(key); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	it, _, err := b.current(ctx, key)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if it == nil {
		return nil, trace.NotFound("key %q is not found", key)
	}
	return it, nil
}

// GetRange implements Backend. Pages after the first are read at the first
// page's revision, so the result is one consistent snapshot.
func (b *Backend) GetRange(ctx context.Context, prefix string, limit int) ([]backend.Item, error) {
	if err := backend.CheckKey(prefix); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	start := b.etcdKey(prefix)
	end := clientv3.GetPrefixRangeEnd(start)
	page := int64(rangePageSize)
	if limit > 0 && limit < rangePageSize {
		page = int64(limit)
	}
	now := b.cfg.Clock.Now()
	var rev int64
	var out []backend.Item
	for {
		opts := []clientv3.OpOption{
			clientv3.WithRange(end),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend),
			clientv3.WithLimit(page),
		}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := b.client.Get(ctx, start, opts...)
		if err != nil {
			return nil, b.convertError(err)
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			it, err := decode(b.userKey(kv.Key), kv.Value)
			if err != nil {
				return nil, trace.Wrap(err)
			}
			if it.Expired(now) {
				continue
			}
			it.Revision = kv.ModRevision
			out = append(out, it)
			if limit > 0 && len(out) >= limit {
				return out, nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// leaseFor returns the lease for item's expiry. Items share one lease per
// expiry second: heartbeats from thousands of nodes then cost about one
// Grant per second instead of one per write. The lease's TTL is rounded up
// (etcd TTLs are whole seconds; rounding down would delete early). Cached
// leases are never revoked early, since other keys may hang on them; they
// are forgotten once their second has passed.
func (b *Backend) leaseFor(ctx context.Context, item backend.Item) (clientv3.LeaseID, error) {
	if item.Expires.IsZero() {
		return clientv3.NoLease, nil
	}
	now := b.cfg.Clock.Now()
	sec := item.Expires.Add(time.Second - 1).Unix()
	b.leaseMu.Lock()
	defer b.leaseMu.Unlock()
	if id, ok := b.leases[sec]; ok {
		return id, nil
	}
	for s := range b.leases {
		if s <= now.Unix() {
			delete(b.leases, s)
		}
	}
	ttl := sec - now.Unix()
	if ttl < 1 {
		ttl = 1
	}
	lease, err := b.client.Grant(ctx, ttl)
	if err != nil {
		return clientv3.NoLease, b.convertError(err)
	}
	b.leases[sec] = lease.ID
	return lease.ID, nil
}

// forgetLease drops a cached lease etcd no longer knows (it expired early
// after a clock jump, or was revoked by hand), so the next write gets a
// fresh one.
func (b *Backend) forgetLease(id clientv3.LeaseID) {
	b.leaseMu.Lock()
	defer b.leaseMu.Unlock()
	for s, l := range b.leases {
		if l == id {
			delete(b.leases, s)
		}
	}
}

// withLease runs op with item's lease, retrying once with a fresh lease if
// the cached one is gone.
func (b *Backend) withLease(ctx context.Context, item backend.Item, op func(opts ...clientv3.OpOption) error) error {
	for attempt := 0; ; attempt++ {
		lease, err := b.leaseFor(ctx, item)
		if err != nil {
			return trace.Wrap(err)
		}
		var opts []clientv3.OpOption
		if lease != clientv3.NoLease {
			opts = append(opts, clientv3.WithLease(lease))
		}
		err = op(opts...)
		if lease != clientv3.NoLease && errors.Is(err, rpctypes.ErrLeaseNotFound) && attempt == 0 {
			b.forgetLease(lease)
			continue
		}
		return err
	}
}

func stored(item backend.Item, rev int64) *backend.Item {
	out := backend.Item{Key: item.Key, Value: bytes.Clone(item.Value), Expires: item.Expires, Revision: rev}
	if out.Value == nil {
		out.Value = []byte{}
	}
	return &out
}

// Put implements Backend.
func (b *Backend) Put(ctx context.Context, item backend.Item) (*backend.Item, error) {
	if err := backend.CheckItem(item); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	var rev int64
	err := b.withLease(ctx, item, func(opts ...clientv3.OpOption) error {
		resp, err := b.client.Put(ctx, b.etcdKey(item.Key), encode(item), opts...)
		if err != nil {
			return err
		}
		rev = resp.Header.Revision
		return nil
	})
	if err != nil {
		return nil, b.convertError(err)
	}
	return stored(item, rev), nil
}

// swap is the shared loop of Create and CompareAndSwap: read the key,
// let check decide (returning an error to give up), then write only if the
// key's ModRevision is still the one read. A concurrent write makes the
// transaction fail and the loop re-read, so check always judges the value
// that is actually replaced.
func (b *Backend) swap(ctx context.Context, item backend.Item, check func(cur *backend.Item) error) (*backend.Item, error) {
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	key := b.etcdKey(item.Key)
	value := encode(item)
	for {
		cur, modRev, err := b.current(ctx, item.Key)
		if err == nil {
			err = check(cur)
		}
		if err != nil {
			return nil, trace.Wrap(err)
		}
		var resp *clientv3.TxnResponse
		err = b.withLease(ctx, item, func(opts ...clientv3.OpOption) error {
			var err error
			resp, err = b.client.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
				Then(clientv3.OpPut(key, value, opts...)).
				Commit()
			return err
		})
		if err != nil {
			return nil, b.convertError(err)
		}
		if resp.Succeeded {
			return stored(item, resp.Header.Revision), nil
		}
		if err := ctx.Err(); err != nil {
			return nil, trace.Wrap(err)
		}
	}
}

// Create implements Backend.
func (b *Backend) Create(ctx context.Context, item backend.Item) (*backend.Item, error) {
	if err := backend.CheckItem(item); err != nil {
		return nil, trace.Wrap(err)
	}
	return b.swap(ctx, item, func(cur *backend.Item) error {
		if cur != nil {
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
	if err := backend.CheckItem(replaceWith); err != nil {
		return nil, trace.Wrap(err)
	}
	if expected.Key != replaceWith.Key {
		return nil, trace.BadParameter("compare and swap keys differ: %q and %q", expected.Key, replaceWith.Key)
	}
	return b.swap(ctx, replaceWith, func(cur *backend.Item) error {
		if cur == nil {
			return trace.CompareFailed("key %q is not found", expected.Key)
		}
		if !bytes.Equal(cur.Value, expected.Value) {
			return trace.CompareFailed("value of key %q has changed", expected.Key)
		}
		return nil
	})
}

// Delete implements Backend. Like swap it deletes only the revision it saw
// live, so an expired item is NotFound even before its lease is revoked.
func (b *Backend) Delete(ctx context.Context, key string) error {
	if err := backend.CheckKey(key); err != nil {
		return trace.Wrap(err)
	}
	if err := b.checkOpen(); err != nil {
		return err
	}
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	ekey := b.etcdKey(key)
	for {
		cur, modRev, err := b.current(ctx, key)
		if err != nil {
			return trace.Wrap(err)
		}
		if cur == nil {
			return trace.NotFound("key %q is not found", key)
		}
		resp, err := b.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(ekey), "=", modRev)).
			Then(clientv3.OpDelete(ekey)).
			Commit()
		if err != nil {
			return b.convertError(err)
		}
		if resp.Succeeded {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return trace.Wrap(err)
		}
	}
}

// DeleteRange implements Backend: one etcd range delete, atomic.
func (b *Backend) DeleteRange(ctx context.Context, prefix string) error {
	if err := backend.CheckKey(prefix); err != nil {
		return trace.Wrap(err)
	}
	if err := b.checkOpen(); err != nil {
		return err
	}
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	start := b.etcdKey(prefix)
	_, err := b.client.Delete(ctx, start, clientv3.WithRange(clientv3.GetPrefixRangeEnd(start)))
	return b.convertError(err)
}
