package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
)

// NewBenchBackendFunc returns a fresh backend for one benchmark, closed by
// b.Cleanup.
type NewBenchBackendFunc func(b *testing.B) backend.Backend

// RunBackendBenchmarks measures the two numbers that matter for Postern:
// how fast heartbeats (puts) can be written, and how long a write takes to
// reach a watcher (the NodeWatcher's view of the cluster lags by that much).
func RunBackendBenchmarks(b *testing.B, newBackend NewBenchBackendFunc) {
	b.Run("Put", func(b *testing.B) { benchPut(b, newBackend, 0) })
	b.Run("PutWithExpiry", func(b *testing.B) { benchPut(b, newBackend, time.Minute) })
	b.Run("WatchDelivery", func(b *testing.B) { benchWatchDelivery(b, newBackend) })
}

// benchPut overwrites a working set of 1000 keys, like node heartbeats
// (which carry an expiry: ttl > 0).
func benchPut(b *testing.B, newBackend NewBenchBackendFunc, ttl time.Duration) {
	bk := newBackend(b)
	ctx := context.Background()
	value := make([]byte, 512) // about the size of a node's JSON
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		item := backend.Item{Key: fmt.Sprintf("/bench/put/%d", i%1000), Value: value}
		if ttl > 0 {
			item.Expires = bk.Clock().Now().Add(ttl)
		}
		_, err := bk.Put(ctx, item)
		if err != nil {
			b.Fatal(err)
		}
	}
}

// benchWatchDelivery measures the latency from the start of a Put to its
// event arriving at a watcher, one write at a time.
func benchWatchDelivery(b *testing.B, newBackend NewBenchBackendFunc) {
	bk := newBackend(b)
	ctx := context.Background()
	w, err := bk.NewWatcher(ctx, backend.Watch{Name: "bench", Prefixes: []string{"/bench/watch/"}})
	require.NoError(b, err)
	b.Cleanup(func() { w.Close() })
	next := func() backend.Event {
		select {
		case ev := <-w.Events():
			return ev
		case <-w.Done():
			b.Fatalf("watcher closed: %v", w.Error())
		case <-time.After(EventTimeout):
			b.Fatal("timed out waiting for an event")
		}
		return backend.Event{}
	}
	require.Equal(b, backend.OpInit, next().Type)
	value := make([]byte, 512)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("/bench/watch/%d", i%1000)
		if _, err := bk.Put(ctx, backend.Item{Key: key, Value: value}); err != nil {
			b.Fatal(err)
		}
		if ev := next(); ev.Item.Key != key {
			b.Fatalf("got %v %q, want put %q", ev.Type, ev.Item.Key, key)
		}
	}
}
