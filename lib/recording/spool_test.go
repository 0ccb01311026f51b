package recording

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/stretchr/testify/require"
)

// countingNotify counts the chunks a SpoolSink reports written.
type countingNotify chan struct{}

func (n countingNotify) notify() { n <- struct{}{} }

func (n countingNotify) wait(t *testing.T, count int) {
	t.Helper()
	for i := 0; i < count; i++ {
		<-n
	}
}

func spoolEntries(t *testing.T, spool DirStorage) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(spool.Dir, testSession))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		if e.Name() != lockName {
			names = append(names, e.Name())
		}
	}
	return names
}

// The node's spool: chunks go into segment files (a new one every
// segmentChunks chunks), DirStorage reads them like chunk files, and the
// uploader ships a running session's chunks as they come, deleting each
// segment once auth has all of it and the writer has moved on, and the
// session once its final chunk is shipped.
func TestSpoolSinkSegmentsAndUploader(t *testing.T) {
	ctx := context.Background()
	spool := DirStorage{Dir: t.TempDir()}
	written := make(countingNotify, 1000)
	w := newTestWriter(t, clockwork.NewFakeClock(), &SpoolSink{Storage: spool, Session: testSession, Notify: written.notify, Clock: clockwork.NewFakeClock()},
		func(c *Config) { c.ChunkBytes = 256 })
	// Each 300-byte output is a chunk of its own (the first with the
	// header): three segments and a bit.
	const events = 3*segmentChunks + 5
	for i := 0; i < events; i++ {
		w.Output(bytes.Repeat([]byte{'a' + byte(i%26)}, 300))
	}
	written.wait(t, events)
	require.Equal(t, []string{segmentName(0), segmentName(segmentChunks), segmentName(2 * segmentChunks), segmentName(3 * segmentChunks)}, spoolEntries(t, spool))
	idx, err := spool.ChunkIndexes(ctx, testSession)
	require.NoError(t, err)
	require.Len(t, idx, events)
	for i, n := range idx {
		require.Equal(t, i, n)
	}
	c, err := spool.GetChunk(ctx, testSession, segmentChunks+3)
	require.NoError(t, err)
	require.Equal(t, segmentChunks+3, c.Index)
	_, err = spool.GetChunk(ctx, testSession, events+10)
	require.Error(t, err)

	dst := DirStorage{Dir: t.TempDir()}
	u, err := NewUploader(UploaderConfig{Spool: spool, Upload: uploadTo{dst}, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	defer u.Close()
	require.NoError(t, u.Flush(ctx))
	got, err := dst.ChunkIndexes(ctx, testSession)
	require.NoError(t, err)
	require.Len(t, got, events, "auth has every chunk written so far")
	require.Equal(t, []string{segmentName(3 * segmentChunks)}, spoolEntries(t, spool),
		"shipped segments are deleted; the one being written stays")

	// Chunks appended to the last segment after the scan are shipped from
	// where the last scan stopped.
	w.Output([]byte("more"))
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)
	require.NoError(t, u.Flush(ctx))
	chunks, err := GetChunks(ctx, dst, testSession)
	require.NoError(t, err)
	res, err := Verify(chunks, final)
	require.NoError(t, err)
	require.True(t, res.Complete)
	require.Nil(t, spoolEntries(t, spool), "a shipped session leaves nothing in the spool")
	_, evs := castOf(t, chunks)
	require.Len(t, evs, events+2)
	require.Equal(t, Event{0, "o", "more"}, evs[events])
}

// A node killed with SIGKILL leaves its segment with a torn last line
// and a session that will never end. After the restart, the uploader
// ships every whole chunk (again, from the start of the segment: auth
// takes an identical chunk twice), ignores the torn one, and removes the
// session from the spool once it is all shipped.
func TestUploaderShipsWhatAKilledNodeSpooled(t *testing.T) {
	ctx := context.Background()
	mem := newMemSink()
	w := newTestWriter(t, clockwork.NewFakeClock(), mem, func(c *Config) { c.ChunkBytes = 256 })
	for i := 0; i < 10; i++ {
		w.Output(bytes.Repeat([]byte{'0' + byte(i)}, 300))
	}
	_, err := w.Close("exit-status 0")
	require.NoError(t, err)
	chunks := mem.all()
	require.Len(t, chunks, 11)

	// The dead process's spool: chunks 0-7 written, chunk 8 torn.
	spool := DirStorage{Dir: t.TempDir()}
	sink := &SpoolSink{Storage: spool, Session: testSession}
	for _, c := range chunks[:8] {
		require.NoError(t, sink.WriteChunk(c))
	}
	require.NoError(t, sink.Close())
	torn, err := appendChunkJSON(nil, chunks[8])
	require.NoError(t, err)
	f, err := os.OpenFile(filepath.Join(spool.Dir, testSession, segmentName(0)), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(torn[:len(torn)/2])
	require.NoError(t, err)
	require.NoError(t, f.Close())
	idx, err := spool.ChunkIndexes(ctx, testSession)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, idx, "a torn line is not a chunk")

	// Auth already had chunks 0-4 from before the kill.
	dst := DirStorage{Dir: t.TempDir()}
	for _, c := range chunks[:5] {
		require.NoError(t, dst.PutChunk(ctx, testSession, c))
	}
	u, err := NewUploader(UploaderConfig{Spool: spool, Upload: uploadTo{dst}, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	defer u.Close()
	require.NoError(t, u.Flush(ctx))
	got, err := GetChunks(ctx, dst, testSession)
	require.NoError(t, err)
	require.Equal(t, chunks[:8], got)
	res, err := Verify(got, "")
	require.NoError(t, err)
	require.False(t, res.Complete)
	require.Nil(t, spoolEntries(t, spool), "an earlier run's session is removed once shipped")
}

// closeOnChunk ships to dst and, once chunk at is shipped, ends the
// session (the final chunk is appended and the writer's lock released)
// while the uploader is still in the same scan: the moment a session
// ends under a scan, which lost its final chunk when the scan then saw
// the writer gone and removed the session's spool.
type closeOnChunk struct {
	dst   DirStorage
	at    int
	close func()
	once  sync.Once
}

func (u *closeOnChunk) PutRecordingChunk(ctx context.Context, s string, c Chunk) error {
	if err := u.dst.PutChunk(ctx, s, c); err != nil {
		return err
	}
	if c.Index == u.at {
		u.once.Do(u.close)
	}
	return nil
}

func (u *closeOnChunk) LastRecordingChunk(ctx context.Context, s string) (*ChunkRef, error) {
	return u.dst.LastChunk(ctx, s)
}

// TestUploaderKeepsAFinalChunkWrittenDuringAScan: a session that ends
// while a scan ships its chunks keeps its final chunk; the next scan
// ships it and the recording is complete.
func TestUploaderKeepsAFinalChunkWrittenDuringAScan(t *testing.T) {
	ctx := context.Background()
	spool := DirStorage{Dir: t.TempDir()}
	w := newTestWriter(t, clockwork.NewFakeClock(), &SpoolSink{Storage: spool, Session: testSession, Clock: clockwork.NewFakeClock()},
		func(c *Config) { c.ChunkBytes = 256 })
	const events = 5
	for i := 0; i < events; i++ {
		w.Output(bytes.Repeat([]byte{'a' + byte(i)}, 300))
	}
	require.NoError(t, w.Sync())
	var final string
	up := &closeOnChunk{dst: DirStorage{Dir: t.TempDir()}, at: events - 1, close: func() {
		var err error
		final, err = w.Close("exit-status 0")
		require.NoError(t, err)
	}}
	u, err := NewUploader(UploaderConfig{Spool: spool, Upload: up, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	defer u.Close()
	require.NoError(t, u.Flush(ctx))
	require.NoError(t, u.Flush(ctx))
	chunks, err := GetChunks(ctx, up.dst, testSession)
	require.NoError(t, err)
	res, err := Verify(chunks, final)
	require.NoError(t, err)
	require.True(t, res.Complete, "the final chunk was shipped: %d chunks", len(chunks))
	require.Nil(t, spoolEntries(t, spool), "then the session left the spool")
}

// flakyUpload fails every call about session down while it is set (auth
// unreachable for it) and counts them.
type flakyUpload struct {
	uploadTo
	mu    sync.Mutex
	down  string
	calls int
}

func (f *flakyUpload) fail(session string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if session != f.down {
		return nil
	}
	f.calls++
	return trace.ConnectionProblem(nil, "auth is unreachable")
}

func (f *flakyUpload) failed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *flakyUpload) PutRecordingChunk(ctx context.Context, s string, c Chunk) error {
	if err := f.fail(s); err != nil {
		return err
	}
	return f.uploadTo.PutRecordingChunk(ctx, s, c)
}

func (f *flakyUpload) LastRecordingChunk(ctx context.Context, s string) (*ChunkRef, error) {
	if err := f.fail(s); err != nil {
		return nil, err
	}
	return f.uploadTo.LastRecordingChunk(ctx, s)
}

// TestUploaderBacksOffPerSession: a session whose upload fails is tried
// again after its own backoff on the clock, not at every scan, while
// another session ships at once through the one worker; once auth takes
// it again, it ships.
func TestUploaderBacksOffPerSession(t *testing.T) {
	ctx := context.Background()
	const failing = "00000000-0000-4000-8000-000000000001"
	spool := DirStorage{Dir: t.TempDir()}
	mem := newMemSink()
	w := newTestWriter(t, clockwork.NewFakeClock(), mem, nil)
	w.Output([]byte("hello\r\n"))
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)
	for _, s := range []string{failing, testSession} {
		sink := &SpoolSink{Storage: spool, Session: s}
		for _, c := range mem.all() {
			require.NoError(t, sink.WriteChunk(c))
		}
		require.NoError(t, sink.Close())
	}
	dst := DirStorage{Dir: t.TempDir()}
	up := &flakyUpload{uploadTo: uploadTo{dst}, down: failing}
	clock := clockwork.NewFakeClock()
	u, err := NewUploader(UploaderConfig{Spool: spool, Upload: up, Deps: observe.Deps{Clock: clock}, Concurrency: 1})
	require.NoError(t, err)
	defer u.Close()

	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(spool.Dir, testSession))
		return os.IsNotExist(err)
	}, 10*time.Second, 5*time.Millisecond, "the other session ships at once")
	got, err := GetChunks(ctx, dst, testSession)
	require.NoError(t, err)
	_, err = Verify(got, final)
	require.NoError(t, err)
	require.Equal(t, 1, up.failed())
	// Not due before its backoff (at least half of RetryInterval): a scan
	// leaves it alone. The scan's queue is in the spool's order, so once
	// a session spooled now (sorted after it) is shipped, that scan would
	// have tried the failing one first.
	clock.Advance(DefaultRetryInterval / 4)
	later := "00000000-0000-4000-8000-000000000003"
	sink := &SpoolSink{Storage: spool, Session: later}
	for _, c := range mem.all() {
		require.NoError(t, sink.WriteChunk(c))
	}
	require.NoError(t, sink.Close())
	u.Notify()
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(spool.Dir, later))
		return os.IsNotExist(err)
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, up.failed(), "not tried again before its backoff")

	before := up.failed()
	clock.Advance(DefaultRetryInterval)
	u.Notify()
	require.Eventually(t, func() bool { return up.failed() > before }, 10*time.Second, 5*time.Millisecond, "tried again after its backoff")

	// Auth takes it again: it ships once its (doubled) backoff is over.
	up.mu.Lock()
	up.down = ""
	up.mu.Unlock()
	clock.Advance(2 * DefaultRetryInterval)
	u.Notify()
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(spool.Dir, failing))
		return os.IsNotExist(err)
	}, 10*time.Second, 5*time.Millisecond)
	got, err = GetChunks(ctx, dst, failing)
	require.NoError(t, err)
	require.Len(t, got, len(mem.all()))
}
