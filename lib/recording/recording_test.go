package recording

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testSession = "0b7c9a4e-1d2f-4a3b-8c5d-6e7f8091a2b3"

// memSink keeps chunks in memory and signals each one.
type memSink struct {
	mu     sync.Mutex
	chunks []Chunk
	got    chan int
}

func newMemSink() *memSink { return &memSink{got: make(chan int, 1000)} }

func (m *memSink) WriteChunk(c Chunk) error {
	m.mu.Lock()
	m.chunks = append(m.chunks, c)
	m.mu.Unlock()
	m.got <- c.Index
	return nil
}

func (m *memSink) all() []Chunk {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Chunk(nil), m.chunks...)
}

func newTestWriter(t *testing.T, clock clockwork.Clock, sink Sink, mod func(*Config)) *Writer {
	cfg := Config{
		Header: Header{SessionID: testSession, Width: 80, Height: 24, User: "alice", Login: "root", Node: "n1", Cluster: "c"},
		Sink:   sink, Deps: observe.Deps{Clock: clock},
	}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(cfg)
	require.NoError(t, err)
	return w
}

func castOf(t *testing.T, chunks []Chunk) (*Header, []Event) {
	var buf bytes.Buffer
	require.NoError(t, Export(&buf, chunks))
	h, evs, err := Parse(buf.Bytes())
	require.NoError(t, err)
	return h, evs
}

func TestWriterEventsAndTimestamps(t *testing.T) {
	clock := clockwork.NewFakeClock()
	sink := newMemSink()
	w := newTestWriter(t, clock, sink, nil)
	w.Output([]byte("one\r\n"))
	clock.Advance(200 * time.Millisecond)
	w.Resize(100, 30)
	w.Input([]byte("secret")) // record_input off: dropped
	clock.Advance(300 * time.Millisecond)
	w.Output([]byte("two\xff\r\n")) // invalid UTF-8 is replaced, not dropped
	final, err := w.Close("exit-status 3")
	require.NoError(t, err)

	chunks := sink.all()
	res, err := Verify(chunks, final)
	require.NoError(t, err)
	require.True(t, res.Complete)
	h, evs := castOf(t, chunks)
	require.Equal(t, 2, h.Version)
	require.Equal(t, "alice", h.User)
	require.Equal(t, testSession, h.SessionID)
	require.Len(t, evs, 4)
	require.Equal(t, Event{0, "o", "one\r\n"}, evs[0])
	require.Equal(t, Event{0.2, "r", "100x30"}, evs[1])
	require.Equal(t, "o", evs[2].Code)
	require.Equal(t, "two\uFFFD\r\n", evs[2].Data)
	require.InDelta(t, 0.5, evs[2].Time, 1e-9)
	require.Equal(t, Event{0.5, "m", "exit-status 3"}, evs[3])
	for i := 1; i < len(evs); i++ {
		require.GreaterOrEqual(t, evs[i].Time, evs[i-1].Time)
	}
}

func TestWriterRecordsInputWhenAsked(t *testing.T) {
	sink := newMemSink()
	w := newTestWriter(t, clockwork.NewFakeClock(), sink, func(c *Config) { c.RecordInput = true })
	w.Input([]byte("ls\r"))
	_, err := w.Close("")
	require.NoError(t, err)
	_, evs := castOf(t, sink.all())
	require.Equal(t, []Event{{0, "i", "ls\r"}}, evs)
}

// A chunk closes at most FlushInterval after its first event, by the
// injected clock, and at ChunkBytes.
func TestWriterChunking(t *testing.T) {
	clock := clockwork.NewFakeClock()
	sink := newMemSink()
	w := newTestWriter(t, clock, sink, func(c *Config) { c.ChunkBytes = 1024 })
	w.Output([]byte("a"))
	clock.BlockUntilContext(context.Background(), 1)
	clock.Advance(999 * time.Millisecond)
	select {
	case <-sink.got:
		t.Fatal("chunk closed before the flush interval")
	default:
	}
	clock.Advance(time.Millisecond)
	require.Equal(t, 0, <-sink.got)

	w.Output(bytes.Repeat([]byte("x"), 2000)) // over ChunkBytes: closes at once
	require.Equal(t, 1, <-sink.got)
	final, err := w.Close("")
	require.NoError(t, err)
	require.Equal(t, 2, <-sink.got)
	res, err := Verify(sink.all(), final)
	require.NoError(t, err)
	require.Equal(t, 3, res.Chunks)
}

// The cap ends recording with a marker and calls OnCap; the writer keeps
// accepting (and dropping) output, so the session goes on.
func TestWriterCap(t *testing.T) {
	sink := newMemSink()
	capped := make(chan struct{}, 1)
	w := newTestWriter(t, clockwork.NewFakeClock(), sink, func(c *Config) {
		c.MaxBytes = 4096
		c.OnCap = func() { capped <- struct{}{} }
	})
	for i := 0; i < 100; i++ {
		w.Output(bytes.Repeat([]byte("y"), 100))
	}
	<-capped
	require.True(t, w.Capped())
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)
	_, err = Verify(sink.all(), final)
	require.NoError(t, err)
	var total int
	for _, c := range sink.all() {
		b, err := DecodeChunk(c.Data)
		require.NoError(t, err)
		total += len(b)
	}
	require.Less(t, total, 4096+1024)
	_, evs := castOf(t, sink.all())
	capMark := evs[len(evs)-2]
	require.Equal(t, "m", capMark.Code)
	require.Contains(t, capMark.Data, "max_recording_bytes")
	require.Equal(t, "exit-status 0", evs[len(evs)-1].Data, "the exit status is still marked")
}

func threeChunks(t *testing.T) ([]Chunk, string) {
	clock := clockwork.NewFakeClock()
	sink := newMemSink()
	w := newTestWriter(t, clock, sink, func(c *Config) { c.ChunkBytes = 256 })
	for i := 0; i < 3; i++ {
		w.Output(bytes.Repeat([]byte{'a' + byte(i)}, 300))
	}
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)
	chunks := sink.all()
	require.GreaterOrEqual(t, len(chunks), 4)
	return chunks, final
}

func TestVerifyFindsTampering(t *testing.T) {
	chunks, final := threeChunks(t)
	_, err := Verify(chunks, final)
	require.NoError(t, err)

	t.Run("flipped byte", func(t *testing.T) {
		c := append([]Chunk(nil), chunks...)
		d := append([]byte(nil), c[1].Data...)
		d[len(d)/2] ^= 1
		c[1].Data = d
		_, err := Verify(c, final)
		require.ErrorContains(t, err, "chunk 1 is wrong")
	})
	t.Run("deleted middle chunk", func(t *testing.T) {
		c := append(append([]Chunk(nil), chunks[:2]...), chunks[3:]...)
		_, err := Verify(c, final)
		require.ErrorContains(t, err, "chunk 2 is missing")
	})
	t.Run("cut tail", func(t *testing.T) {
		c := chunks[:len(chunks)-1]
		res, err := Verify(c, "")
		require.NoError(t, err, "the chain itself is sound")
		require.False(t, res.Complete, "but it is marked incomplete")
		_, err = Verify(c, final)
		require.ErrorContains(t, err, "tail is cut")
	})
	t.Run("truncated last chunk", func(t *testing.T) {
		c := append([]Chunk(nil), chunks...)
		n := len(c) - 1
		c[n].Data = c[n].Data[:len(c[n].Data)-5]
		_, err := Verify(c, final)
		require.ErrorContains(t, err, "is wrong")
	})
	t.Run("rehashed chain", func(t *testing.T) {
		// An attacker who rewrites a chunk and recomputes every hash is
		// caught by the audited final hash.
		c := append([]Chunk(nil), chunks...)
		gz, err := compress([]byte("[0.1,\"o\",\"forged\"]\n"))
		require.NoError(t, err)
		c[1].Data = gz
		prev := c[0].Hash
		for i := 1; i < len(c); i++ {
			c[i].Hash, err = ChainHash(prev, c[i].Data)
			require.NoError(t, err)
			prev = c[i].Hash
		}
		_, err = Verify(c, final)
		require.ErrorContains(t, err, "session.end event says")
	})
}

func TestDirStorageAndUploader(t *testing.T) {
	spool := DirStorage{Dir: t.TempDir()}
	w := newTestWriter(t, clockwork.NewFakeClock(), &DirSink{Storage: spool, Session: testSession}, nil)
	w.Output([]byte("hello\r\n"))
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)

	dst := DirStorage{Dir: t.TempDir()}
	up := uploadTo{dst}
	u, err := NewUploader(UploaderConfig{Spool: spool, Upload: up, Deps: observe.Deps{Clock: clockwork.NewFakeClock()}})
	require.NoError(t, err)
	require.NoError(t, u.Flush(context.Background()))
	require.NoError(t, u.Close())

	got, err := GetChunks(context.Background(), dst, testSession)
	require.NoError(t, err)
	_, err = Verify(got, final)
	require.NoError(t, err)
	m, err := dst.GetMeta(context.Background(), testSession)
	require.NoError(t, err)
	require.True(t, m.Complete)
	require.Equal(t, "alice", m.User)
	list, err := dst.List(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1)
	_, err = spool.ChunkIndexes(context.Background(), testSession)
	require.Error(t, err, "the spool is emptied once auth has the chunks")
}

type uploadTo struct{ DirStorage }

func (u uploadTo) PutRecordingChunk(ctx context.Context, s string, c Chunk) error {
	return u.PutChunk(ctx, s, c)
}

func (u uploadTo) LastRecordingChunk(ctx context.Context, s string) (*ChunkRef, error) {
	return u.LastChunk(ctx, s)
}

func TestCheckSessionID(t *testing.T) {
	require.NoError(t, CheckSessionID(testSession))
	for _, bad := range []string{"", "../etc", strings.Repeat("a", 36), testSession + "/x"} {
		require.Error(t, CheckSessionID(bad), bad)
	}
}

func FuzzDecodeChunk(f *testing.F) {
	gz, _ := compress([]byte("{\"version\":2}\n[0.1,\"o\",\"x\"]\n"))
	f.Add(gz)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := DecodeChunk(data)
		if err == nil {
			require.LessOrEqual(t, len(out), MaxChunkDecoded)
			require.Equal(t, byte('\n'), out[len(out)-1])
		}
		_, _, _ = Parse(out)
	})
}

func TestRenderText(t *testing.T) {
	sink := newMemSink()
	w := newTestWriter(t, clockwork.NewFakeClock(), sink, nil)
	w.Output([]byte("\x1b[1;31mred\x1b[0m line\r\n\x1b]0;title\x07\x1b[2Jcounter 1\r\n"))
	w.Resize(100, 30)
	_, err := w.Close("exit-status 3")
	require.NoError(t, err)
	var cast, out bytes.Buffer
	require.NoError(t, Export(&cast, sink.all()))
	require.NoError(t, RenderText(&out, cast.Bytes()))
	require.Equal(t, "red line\ncounter 1\n\n[resize 0.000s] 100x30\n\n[marker 0.000s] exit-status 3\n", out.String())
}

// A chunk file is what json.Marshal of the Chunk writes, so files written
// before the hand-made encoder and after it read the same way.
func TestChunkFileIsJSONMarshal(t *testing.T) {
	for _, c := range []Chunk{
		{Index: 0, Hash: strings.Repeat("ab", 32), Data: []byte("\x1f\x8b gz bytes \x00\xff")},
		{Index: 12345678, Hash: "0f", Final: true, Data: []byte{}},
		{Index: 3, Hash: "", Data: nil},
		{Index: 1, Hash: "<odd \"hash\" \u2028 é>", Data: []byte("x")},
	} {
		want, err := json.Marshal(c)
		require.NoError(t, err)
		got, err := appendChunkJSON([]byte("prefix"), c)
		require.NoError(t, err)
		require.Equal(t, "prefix"+string(want), string(got))
	}
}

// A writer left at the default cap records exactly 256 MiB of event
// lines, then the cap's marker, then (after Close) the exit status: the
// default is in effect, not only a configured cap.
func TestWriterCapsAtTheDefault(t *testing.T) {
	if raceEnabled {
		// 256 MiB through instrumented byte loops takes half a minute of
		// a shared machine; the writer's concurrency is covered by the
		// other tests, this one is about the number.
		t.Skip("runs without -race (256 MiB of events): make test runs it plain")
	}
	var decoded int64
	var tail []byte // the last two chunks
	sink := sinkFunc(func(c Chunk) error {
		b, err := DecodeChunk(c.Data)
		if err != nil {
			return err
		}
		decoded += int64(len(b))
		if len(b) < 64<<10 {
			tail = append(tail, b...)
		} else {
			tail = nil
		}
		return nil
	})
	capped := make(chan struct{}, 1)
	w := newTestWriter(t, clockwork.NewFakeClock(), sink, func(c *Config) {
		c.OnCap = func() { capped <- struct{}{} }
	})
	require.EqualValues(t, 256<<20, w.MaxBytes())
	read := bytes.Repeat([]byte("a"), 1<<20)
	for i := 0; i < 260; i++ {
		w.Output(read)
	}
	<-capped
	require.True(t, w.Capped())
	_, err := w.Close("exit-status 0")
	require.NoError(t, err)
	// 255 whole 1 MiB events fit (each line is 1 MiB and a few bytes);
	// the 256th would pass the cap.
	require.Greater(t, decoded, int64(255<<20))
	require.Less(t, decoded, int64(256<<20)+4096)
	require.Regexp(t, `^\[[0-9.]+,"m","recording stopped: max_recording_bytes \(268435456\) reached"\]\n\[[0-9.]+,"m","exit-status 0"\]\n$`, string(tail))
}

type sinkFunc func(Chunk) error

func (f sinkFunc) WriteChunk(c Chunk) error { return f(c) }

// store compresses a chunk as it encodes it, a few KiB at a time: the
// chunks must still hold every line, in order, each line whole, and close
// at ChunkBytes (the default here, so that a chunk takes several writes
// into its compressor, and one event is larger than a write).
func TestWriterStreamedChunksHoldEveryLine(t *testing.T) {
	sink := newMemSink()
	w := newTestWriter(t, clockwork.NewFakeClock(), sink, func(c *Config) { c.MaxBytes = 1 << 30 })
	var want []byte
	for i := 0; i < 400; i++ {
		p := bytes.Repeat([]byte(fmt.Sprintf("line %d \"q\" \\ \x1b[1m\r\n", i)), 1+i%300)
		if i%97 == 0 {
			p = bytes.Repeat([]byte{0xff, 'x', '\t'}, 20000) // one event over encFlushBytes
		}
		w.Output(p)
		want = appendEvent(want, 0, "o", p)
		if i%50 == 0 {
			w.Resize(uint32(80+i), 24)
			want = appendEvent(want, 0, "r", []byte(fmt.Sprintf("%dx24", 80+i)))
		}
	}
	final, err := w.Close("exit-status 0")
	require.NoError(t, err)
	want = appendEvent(want, 0, "m", []byte("exit-status 0"))
	chunks := sink.all()
	_, err = Verify(chunks, final)
	require.NoError(t, err)
	require.Greater(t, len(chunks), 4)
	var got []byte
	for i, c := range chunks {
		b, err := DecodeChunk(c.Data)
		require.NoError(t, err)
		require.True(t, bytes.HasSuffix(b, []byte("\n")), "chunk %d ends inside a line", i)
		if i == 0 {
			header, rest, ok := bytes.Cut(b, []byte("\n"))
			require.True(t, ok)
			require.Contains(t, string(header), `"version":2`)
			b = rest
		}
		// At most ChunkBytes, plus the line that crossed it.
		lines := bytes.SplitAfter(b, []byte("\n"))
		require.LessOrEqual(t, len(b)-len(lines[len(lines)-2]), DefaultChunkBytes, "chunk %d", i)
		got = append(got, b...)
	}
	require.Equal(t, string(want), string(got))
}

// Sync stores the header before any event (the session's probe of its
// spool) and says when the sink refuses it. A chunk that cannot be stored
// stops the recording there: OnFail is told once, nothing after it is
// stored (a hole would read as tampering), and what came before verifies
// as an incomplete recording.
func TestWriterSyncAndFailure(t *testing.T) {
	t.Run("sync stores the header", func(t *testing.T) {
		sink := newMemSink()
		w := newTestWriter(t, clockwork.NewFakeClock(), sink, nil)
		require.NoError(t, w.Sync())
		got := sink.all()
		require.Len(t, got, 1, "the header is stored before any event")
		h, err := HeaderOf(got[0].Data)
		require.NoError(t, err)
		require.Equal(t, testSession, h.SessionID)
		w.Output([]byte("after"))
		final, err := w.Close("exit-status 0")
		require.NoError(t, err)
		res, err := Verify(sink.all(), final)
		require.NoError(t, err)
		require.True(t, res.Complete)
	})
	t.Run("sync reports a refusing sink", func(t *testing.T) {
		var fails int
		w := newTestWriter(t, clockwork.NewFakeClock(), sinkFunc(func(Chunk) error { return fmt.Errorf("no space left on device") }),
			func(c *Config) { c.OnFail = func(error) { fails++ } })
		require.ErrorContains(t, w.Sync(), "no space left")
		require.True(t, w.Failed())
		_, err := w.Close("")
		require.ErrorContains(t, err, "no space left")
		require.Equal(t, 1, fails)
	})
	t.Run("a failure stops storing", func(t *testing.T) {
		mem := newMemSink()
		var refused int
		var failed []error
		w := newTestWriter(t, clockwork.NewFakeClock(), sinkFunc(func(c Chunk) error {
			if c.Index == 2 && refused == 0 {
				refused++
				return fmt.Errorf("disk full")
			}
			return mem.WriteChunk(c)
		}), func(c *Config) {
			c.ChunkBytes = 256
			c.OnFail = func(err error) { failed = append(failed, err) }
		})
		for i := 0; i < 6; i++ {
			w.Output(bytes.Repeat([]byte{'a' + byte(i)}, 300))
		}
		_, err := w.Close("exit-status 0")
		require.ErrorContains(t, err, "disk full")
		require.Len(t, failed, 1)
		got := mem.all()
		require.Len(t, got, 2, "nothing is stored after the failed chunk, though the sink would take it")
		res, err := Verify(got, "")
		require.NoError(t, err)
		require.False(t, res.Complete)
	})
}

// TestWriterKeepsASizeWithoutOne: a terminal asked for without a size
// (0x0, as `ssh -tt` from a pipe does) is recorded at 80x24, a window
// change to 0x0 is left out, and one with a single dimension keeps the
// other: asciicast players refuse a 0 anywhere.
func TestWriterKeepsASizeWithoutOne(t *testing.T) {
	sink := newMemSink()
	w := newTestWriter(t, clockwork.NewFakeClock(), sink, func(c *Config) { c.Header.Width, c.Header.Height = 0, 0 })
	w.Output([]byte("hi"))
	w.Resize(0, 0)
	w.Resize(100, 0)
	w.Resize(120, 40)
	_, err := w.Close("exit-status 0")
	require.NoError(t, err)
	h, evs := castOf(t, sink.all())
	require.Equal(t, uint32(80), h.Width)
	require.Equal(t, uint32(24), h.Height)
	var resizes []string
	for _, e := range evs {
		if e.Code == "r" {
			resizes = append(resizes, e.Data)
		}
	}
	require.Equal(t, []string{"100x24", "120x40"}, resizes)
}
