package s3store

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
)

// TestRetention: on both stores, a pass at start deletes the recordings
// whose session started more than MaxAge ago and reports their ids; the
// next tick of the (fake) clock deletes the one that has aged past it
// since, and leaves the young one.
func TestRetention(t *testing.T) {
	const day = 24 * time.Hour
	sessC := "7f3e4d5c-6071-4c8d-8e9f-1a2b3c4d5e6f"
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			ctx := context.Background()
			st, other := k.open(t)
			now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
			clock := clockwork.NewFakeClockAt(now)
			for s, age := range map[string]time.Duration{sessA: 100 * day, sessB: 90*day - time.Hour, sessC: day} {
				for _, c := range record(t, s, "alice", now.Add(-age).Unix(), 4) {
					require.NoError(t, other.PutChunk(ctx, s, c))
				}
			}
			deleted := make(chan []string, 4)
			r, err := recording.NewRetention(recording.RetentionConfig{
				Store: st, MaxAge: 90 * day, Interval: time.Hour, Deps: observe.Deps{Clock: clock},
				Deleted: func(_ context.Context, ids []string) { deleted <- ids },
			})
			require.NoError(t, err)
			defer r.Close()
			require.Equal(t, []string{sessA}, <-deleted)
			left := func() []string {
				list, err := other.List(ctx)
				require.NoError(t, err)
				var ids []string
				for _, m := range list {
					ids = append(ids, m.SessionID)
				}
				return ids
			}
			require.Equal(t, []string{sessB, sessC}, left())

			clock.Advance(2 * time.Hour)
			require.Equal(t, []string{sessB}, <-deleted)
			require.Equal(t, []string{sessC}, left())
			_, err = other.ChunkIndexes(ctx, sessB)
			require.Error(t, err, "every chunk of it is gone")
		})
	}
}
