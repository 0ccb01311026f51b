package backend

import (
	"context"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRangeEnd(t *testing.T) {
	require.Equal(t, "/a0", RangeEnd("/a/"))
	require.Equal(t, "/b", RangeEnd("/a"))
	require.Equal(t, "/b", RangeEnd("/a\xff"))
	require.Equal(t, "", RangeEnd("\xff\xff"))
	for _, k := range []string{"/a/", "/a/x", "/a/\xff\xff"} {
		require.Less(t, k, RangeEnd("/a/"))
	}
	require.GreaterOrEqual(t, "/ab", RangeEnd("/a/"))
}

func TestFanout(t *testing.T) {
	f := NewFanout()
	ctx := context.Background()
	w, err := f.NewWatcher(ctx, Watch{Name: "a", Prefixes: []string{"/a/"}, QueueSize: 3})
	require.NoError(t, err)
	all, err := f.NewWatcher(ctx, Watch{Name: "all"})
	require.NoError(t, err)
	require.Equal(t, 2, f.Len())

	f.Emit(Event{Type: OpPut, Item: Item{Key: "/a/1"}}, Event{Type: OpPut, Item: Item{Key: "/b/1"}})
	require.Equal(t, OpInit, (<-w.Events()).Type)
	require.Equal(t, "/a/1", (<-w.Events()).Item.Key)
	require.Equal(t, OpInit, (<-all.Events()).Type)
	require.Equal(t, "/a/1", (<-all.Events()).Item.Key)
	require.Equal(t, "/b/1", (<-all.Events()).Item.Key)

	// Overflow closes only the slow watcher, with LimitExceeded.
	for range 4 {
		f.Emit(Event{Type: OpDelete, Item: Item{Key: "/a/2"}})
	}
	<-w.Done()
	require.True(t, trace.IsLimitExceeded(w.Error()), "%v", w.Error())
	require.Equal(t, 1, f.Len())
	require.Len(t, all.Events(), 4)

	// A watcher whose context is already done closes at once.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	dead, err := f.NewWatcher(cctx, Watch{Name: "dead"})
	require.NoError(t, err)
	<-dead.Done()
	require.ErrorIs(t, dead.Error(), context.Canceled)

	f.Close()
	<-all.Done()
	require.True(t, trace.IsConnectionProblem(all.Error()), "%v", all.Error())
	require.Equal(t, 0, f.Len())
	_, err = f.NewWatcher(ctx, Watch{})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
}
