package etcdbk

import (
	"context"

	"github.com/gravitational/trace"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/lib/backend"
)

// NewWatcher implements Backend with one native etcd watch per watcher.
//
// OpInit is pushed when etcd confirms the watch is created
// (WithCreatedNotify): from that revision on etcd delivers every change, so
// the promise "nothing written after OpInit is missed" holds.
//
// A watcher with several prefixes watches the whole namespace and filters
// here: separate etcd watches per prefix would each be ordered, but not with
// respect to one another, and commit order across prefixes is part of the
// contract.
func (b *Backend) NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, trace.ConnectionProblem(nil, "etcd backend is closed")
	}
	start := b.etcdKey(backend.Separator)
	if len(watch.Prefixes) == 1 {
		start = b.etcdKey(watch.Prefixes[0])
	}
	// The watch runs on its own context, cancelled when the watcher closes
	// (by its owner, by ctx, by overflow or by Close). WithRequireLeader
	// makes etcd cancel the watch when the member loses its leader, instead
	// of silently delivering nothing during a partition.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	w := backend.NewBufferedWatcherNoInit(ctx, watch, func(w *backend.BufferedWatcher) {
		cancel()
		b.mu.Lock()
		delete(b.watchers, w)
		b.mu.Unlock()
	})
	b.watchers[w] = struct{}{}
	ch := b.client.Watch(wctx, start,
		clientv3.WithRange(clientv3.GetPrefixRangeEnd(start)),
		clientv3.WithCreatedNotify())
	b.wg.Add(1)
	go b.runWatch(wctx, w, ch)
	return w, nil
}

// runWatch translates etcd watch responses into backend events until the
// watcher closes or the etcd watch ends.
func (b *Backend) runWatch(ctx context.Context, w *backend.BufferedWatcher, ch clientv3.WatchChan) {
	defer b.wg.Done()
	// Once we stop reading, the watcher is closed and its context
	// cancelled; drain so the client's goroutines never block on us.
	defer func() {
		for range ch {
		}
	}()
	log := b.cfg.Logger.WithField("watch", w.Watch().Name)
	for resp := range ch {
		if err := resp.Err(); err != nil {
			w.CloseWithError(trace.ConnectionProblem(err, "etcd watch %q failed: %v", w.Watch().Name, err))
			return
		}
		if resp.Created {
			if !w.Push(backend.Event{Type: backend.OpInit}) {
				return
			}
			continue
		}
		for _, ev := range resp.Events {
			key := b.userKey(ev.Kv.Key)
			if !w.Matches(key) {
				continue
			}
			var out backend.Event
			switch ev.Type {
			case clientv3.EventTypePut:
				it, err := decode(key, ev.Kv.Value)
				if err != nil {
					// Something else wrote into our namespace; reads
					// report it, the watch cannot, so log and skip.
					log.WithError(err).Warn("Skipping a foreign value in the etcd namespace.")
					continue
				}
				it.Revision = ev.Kv.ModRevision
				out = backend.Event{Type: backend.OpPut, Item: it}
			case clientv3.EventTypeDelete:
				out = backend.Event{Type: backend.OpDelete, Item: backend.Item{Key: key}}
			default:
				continue
			}
			if !w.Push(out) {
				return
			}
		}
	}
	if ctx.Err() == nil {
		w.CloseWithError(trace.ConnectionProblem(nil, "etcd watch %q ended", w.Watch().Name))
	}
}
