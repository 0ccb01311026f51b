package recording

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
)

// Defaults; see Config for what zero means.
const (
	// DefaultChunkBytes closes a chunk at 256 KiB of events: small enough
	// to upload in one call and to seek by, large enough to compress well.
	DefaultChunkBytes = 256 << 10
	// DefaultFlushInterval closes a chunk one second after its first
	// event: what a node killed with SIGKILL may lose at most.
	DefaultFlushInterval = time.Second
	// DefaultMaxBytes caps a session's recorded events (uncompressed) at
	// 256 MiB: a `cat` of a disk image must not fill the node's disk.
	DefaultMaxBytes = 256 << 20
	// DefaultWidth and DefaultHeight are a recording's size when the
	// client gave none: the classic terminal's 80x24.
	DefaultWidth, DefaultHeight = 80, 24
)

// Header is the asciicast v2 header with Postern's fields (asciicast
// readers ignore fields they do not know).
type Header struct {
	Version   int               `json:"version"`
	Width     uint32            `json:"width"`
	Height    uint32            `json:"height"`
	Timestamp int64             `json:"timestamp"`
	Command   string            `json:"command,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	SessionID string            `json:"postern_session_id"`
	User      string            `json:"user"`
	Login     string            `json:"login"`
	// Node is the node's UUID (the auth server checks that the uploading
	// node is this one); NodeHostname is for people.
	Node         string `json:"node"`
	NodeHostname string `json:"node_hostname,omitempty"`
	Cluster      string `json:"cluster"`
}

// Sink stores closed chunks: SpoolSink into the node's spool, DirSink one
// file per chunk. A Sink that is also an io.Closer is closed after the
// final chunk.
type Sink interface {
	WriteChunk(c Chunk) error
}

// Config configures a Writer.
type Config struct {
	// Header is written first; Version and Timestamp are set here.
	// SessionID is required.
	Header Header
	// Sink receives each chunk as it closes. Required.
	Sink Sink
	// Deps: Clock times events and the flush interval.
	observe.Deps
	// ChunkBytes: zero means DefaultChunkBytes.
	ChunkBytes int
	// FlushInterval: zero means DefaultFlushInterval.
	FlushInterval time.Duration
	// MaxBytes caps the recorded events; zero means DefaultMaxBytes.
	MaxBytes int64
	// RecordInput records "i" events; off by default because passwords
	// typed at prompts are input.
	RecordInput bool
	// OnCap is called once when MaxBytes is reached (the session emits an
	// audit event), from the writer's store goroutine, before Close
	// returns. Nil means nothing is called.
	OnCap func()
	// OnFail is called once, from the writer's store goroutine, when a
	// chunk cannot be stored (a full or read-only spool): from then on
	// nothing more is recorded, because a recording with a hole in the
	// middle would read as tampered with. Nil means nothing is called;
	// Close reports the error either way.
	OnFail func(err error)
}

// CheckAndSetDefaults validates c.
func (c *Config) CheckAndSetDefaults() error {
	if c.Header.SessionID == "" {
		return trace.BadParameter("recording: missing Header.SessionID")
	}
	if c.Sink == nil {
		return trace.BadParameter("recording: missing Sink")
	}
	c.Deps.SetDefaults(observe.ComponentRecording)
	if c.ChunkBytes <= 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Header.Width == 0 || c.Header.Height == 0 {
		// A client may ask for a terminal without a size (OpenSSH's
		// `ssh -tt` from a pipe sends 0x0); asciicast players refuse a
		// 0x0 recording outright, so it is kept at the size a terminal
		// without one gets.
		c.Header.Width, c.Header.Height = DefaultWidth, DefaultHeight
	}
	return nil
}

// Writer records one session. Its methods are safe for concurrent use
// (the pty copy, the request loop and the flush timer call them).
//
// The session's output copy calls Output on every pty read, so the work
// done there is kept to a copy of the bytes: each event is appended raw
// (time, code, data) to a batch, and one goroutine per recording (store)
// encodes the batches as asciicast lines, cuts them into chunks,
// compresses, chains and stores them. The chunks are what they were when
// the copy encoded them itself: a chunk closes at ChunkBytes of encoded
// lines or FlushInterval after its first event, whichever comes first.
type Writer struct {
	cfg   Config
	start time.Time

	// mu guards the batch being filled; never held while waiting on the
	// disk or the network, only while handing a full batch to store.
	mu  sync.Mutex
	raw []byte // events since the last hand-off (appendRaw)
	// cols, rows: the size recorded last (the header's, then each
	// resize's), which fills in a dimension a resize lacks.
	cols, rows uint32
	last       float64 // last event time, so times never go back
	closed     bool
	timer      clockwork.Timer // flush timer, armed while raw holds events
	// atLeast is a lower bound of the encoded event bytes so far: past
	// MaxBytes, the cap is certainly reached, and capSeen says that the
	// batch was handed over for store to notice.
	atLeast int64
	capSeen bool
	// rawBatch is when a batch is handed over by size: a little under
	// ChunkBytes, because encoding only adds bytes (escapes), so that a
	// batch of text becomes one chunk.
	rawBatch int

	// capped is set by store when MaxBytes is reached, failed when a
	// chunk could not be stored: from then on the copy does not even
	// append.
	capped atomic.Bool
	failed atomic.Bool

	// queue bounds how far store may fall behind. When it is full the
	// copy waits (backpressure): a recorder that fell behind slows the
	// session's output rather than losing it, because output dropped
	// silently would let a flood of output hide what followed it. store
	// encodes and compresses far faster than a pty delivers, so in
	// practice the queue never fills; the memory it holds stays bounded.
	queue  chan batch
	stored chan struct{} // closed when store has returned
	// finalHex and sinkErr (the first storing error) are read after
	// stored is closed.
	finalHex string
	sinkErr  error
}

// batch is a run of raw events on its way to store. Every batch ends a
// chunk: it is handed over at rawBatch bytes or by the flush timer.
type batch struct {
	raw   []byte
	final bool
	// The last markers of a final batch: exit (when set) and, when the
	// last chunk would otherwise be empty, "end", both timed at.
	exit string
	at   float64
	// synced, when set, receives the first storing error (nil for none)
	// once store has stored the batch (Sync); it has room for one.
	synced chan error
}

// storeQueue is how many batches may wait for the store goroutine: with
// DefaultChunkBytes, under a MiB.
const storeQueue = 4

// Raw event codes; each is one byte in a batch.
const (
	codeOutput = 'o'
	codeInput  = 'i'
	codeResize = 'r'
	codeMarker = 'm'
)

// New starts a recording: the header goes into the first chunk.
func New(cfg Config) (*Writer, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	h := cfg.Header
	h.Version = 2
	w := &Writer{cfg: cfg, start: cfg.Clock.Now(), queue: make(chan batch, storeQueue), stored: make(chan struct{}),
		cols: cfg.Header.Width, rows: cfg.Header.Height}
	w.rawBatch = max(1, cfg.ChunkBytes-cfg.ChunkBytes/8)
	h.Timestamp = w.start.Unix()
	line, err := json.Marshal(h)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	go w.store(append(line, '\n'))
	return w, nil
}

// Output records terminal output.
func (w *Writer) Output(p []byte) { w.event(codeOutput, p) }

// Input records terminal input when RecordInput is on.
func (w *Writer) Input(p []byte) {
	if w.cfg.RecordInput {
		w.event(codeInput, p)
	}
}

// Resize records a terminal size change. A dimension given as 0 (a
// terminal opened without a size, then `stty cols 100` in it) keeps the
// size recorded last, which players can draw; 0x0 is no change.
func (w *Writer) Resize(cols, rows uint32) {
	if cols == 0 && rows == 0 {
		return
	}
	w.mu.Lock()
	if cols == 0 {
		cols = w.cols
	}
	if rows == 0 {
		rows = w.rows
	}
	w.cols, w.rows = cols, rows
	w.mu.Unlock()
	w.event(codeResize, []byte(fmt.Sprintf("%dx%d", cols, rows)))
}

// Marker records a named point (exec command, sftp, agent, exit status).
func (w *Writer) Marker(label string) { w.event(codeMarker, []byte(label)) }

// event appends one raw event to the batch: a copy, no encoding.
func (w *Writer) event(code byte, data []byte) {
	if w.capped.Load() || w.failed.Load() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if w.raw == nil {
		// A buffer only while events wait: an idle session holds none.
		w.raw = rawPool.Get().([]byte)[:0]
	}
	w.raw = appendRaw(w.raw, w.nowLocked(), code, data)
	w.atLeast += int64(len(data)) + minEncodedEvent
	if len(w.raw) >= w.rawBatch || (w.atLeast > w.cfg.MaxBytes && !w.capSeen) {
		// At the cap, at once: the cap's marker and audit event come
		// when the event that hit it is recorded, not a second later.
		w.capSeen = w.atLeast > w.cfg.MaxBytes
		w.handOffLocked(batch{})
		return
	}
	w.armLocked()
}

// minEncodedEvent is the least an event's line adds to its data:
// `[0.000000,"o",""]` and a newline.
const minEncodedEvent = 18

// nowLocked is the time of an event in the recording, never before the
// previous event's.
func (w *Writer) nowLocked() float64 {
	t := w.cfg.Clock.Since(w.start).Seconds()
	if t < w.last {
		t = w.last
	}
	w.last = t
	return t
}

// rawHeader is a raw event's header: the time (float64 bits), the code,
// the data's length.
const rawHeader = 8 + 1 + 4

func appendRaw(dst []byte, t float64, code byte, data []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(t))
	dst = append(dst, code)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(data)))
	return append(dst, data...)
}

// nextRaw splits the first raw event off b.
func nextRaw(b []byte) (t float64, code byte, data, rest []byte) {
	t = math.Float64frombits(binary.LittleEndian.Uint64(b))
	code = b[8]
	n := int(binary.LittleEndian.Uint32(b[9:]))
	return t, code, b[rawHeader : rawHeader+n], b[rawHeader+n:]
}

// rawPool recycles batch buffers between the writer and store, encPool
// store's encoding buffers. Both are taken only while there are events,
// so that the thousand idle sessions of a busy node hold no buffers.
var (
	rawPool = sync.Pool{New: func() any { return make([]byte, 0, DefaultChunkBytes+64<<10) }}
	encPool = sync.Pool{New: func() any { return make([]byte, 0, encPoolCap) }}
)

// encFlushBytes is how much encoded output store collects before it
// feeds the chunk's compressor: small enough to be in the cache still,
// large enough that the compressor is called a few times per chunk.
// encPoolCap holds that plus one event of a 32 KiB read, escaped.
const (
	encFlushBytes = 32 << 10
	encPoolCap    = 3 * encFlushBytes
)

// eventCodes are the asciicast codes of the raw ones.
var eventCodes = [256]string{codeOutput: "o", codeInput: "i", codeResize: "r", codeMarker: "m"}

// appendEvent appends `[TIME,"CODE","DATA"]\n`: what json.Marshal would
// write, less its HTML escaping (a terminal's `<` stays one byte), by hand
// because this runs on every pty read of a recorded session. Output is
// bytes and asciicast wants a string, so each byte that is not part of
// valid UTF-8 (a split multi-byte rune, binary) becomes U+FFFD, as
// asciinema itself does (and as ranging over a Go string does: recordings
// written before this fast path are byte for byte the same).
//
// Terminal output is mostly printable ASCII, so runs of it are skipped
// eight bytes at a time (unsafeBytes), straight to the next byte that
// needs a look, and copied in one append.
func appendEvent(dst []byte, t float64, code string, p []byte) []byte {
	dst = append(dst, '[')
	dst = strconv.AppendFloat(dst, t, 'f', 6, 64)
	dst = append(dst, ',', '"')
	dst = append(dst, code...)
	dst = append(dst, '"', ',', '"')
	start := 0
	for i := 0; i < len(p); {
		if i+8 <= len(p) {
			if m := unsafeBytes(binary.LittleEndian.Uint64(p[i:])); m == 0 {
				i += 8
				continue
			} else {
				// Straight to the first byte that is not plain ASCII.
				i += bits.TrailingZeros64(m) >> 3
			}
		}
		c := p[i]
		if safeASCII[c] {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(p[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
			dst = append(dst, p[start:i]...)
			dst = append(dst, "\ufffd"...)
			i++
			start = i
			continue
		}
		dst = append(dst, p[start:i]...)
		if c == '\r' && i+1 < len(p) && p[i+1] == '\n' {
			// A terminal's line end, the most common escape by far.
			dst = append(dst, `\r\n`...)
			i += 2
		} else {
			dst = append(dst, jsonEscapes[c]...)
			i++
		}
		start = i
	}
	dst = append(dst, p[start:]...)
	return append(dst, '"', ']', '\n')
}

const hexDigits = "0123456789abcdef"

// jsonEscapes[c] is how byte c (below 0x20, '"' or '\\') is written in a
// JSON string, as encoding/json writes it.
var jsonEscapes = func() (t [256]string) {
	for c := 0; c < 0x20; c++ {
		t[c] = `\u00` + string(hexDigits[c>>4]) + string(hexDigits[c&0xf])
	}
	t['"'], t['\\'], t['\n'], t['\r'], t['\t'] = `\"`, `\\`, `\n`, `\r`, `\t`
	return t
}()

// safeASCII[c] says that byte c goes into a JSON string as it is.
var safeASCII = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// Word-at-a-time tests (the classic "has a zero byte" trick): lo has 0x01
// in every byte, hi 0x80.
const (
	lo = 0x0101010101010101
	hi = 0x8080808080808080
)

// unsafeBytes flags the bytes of v (eight, little-endian) that are not
// safeASCII: its lowest set bit is the high bit of the first such byte.
// (Above that one, a borrow may flag a safe byte too: only the first
// flag is exact, and only the first is used.)
func unsafeBytes(v uint64) uint64 {
	below := (v - 0x20*lo) &^ v      // high bit set where a byte < 0x20 (or >= 0x80)
	quote := v ^ '"'*lo              // zero where a byte is '"'
	quote = (quote - lo) &^ quote    // high bit set there
	bslash := v ^ '\\'*lo            // zero where a byte is '\\'
	bslash = (bslash - lo) &^ bslash // high bit set there
	return (v | below | quote | bslash) & hi
}

func (w *Writer) armLocked() {
	if w.timer == nil && len(w.raw) > 0 {
		w.timer = w.cfg.Clock.AfterFunc(w.cfg.FlushInterval, w.onTimer)
	}
}

func (w *Writer) onTimer() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = nil
	if !w.closed && len(w.raw) > 0 {
		w.handOffLocked(batch{})
	}
}

// handOffLocked hands the batch (with b's final fields) to store, which
// ends a chunk with it.
func (w *Writer) handOffLocked(b batch) {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	b.raw = w.raw
	w.queue <- b
	w.raw = nil
}

// store turns batches into chunks, in order: it encodes each event into
// the chunk, closes the chunk at ChunkBytes and at the end of every
// batch, and stops recording at MaxBytes with a marker. After a storing
// error it stores nothing more (OnFail is told; Close reports it): what
// was stored before stays a valid, incomplete recording.
func (w *Writer) store(header []byte) {
	defer close(w.stored)
	var (
		// enc holds the lines encoded since the last write into the
		// chunk's compressor: the chunk is compressed as it is
		// encoded, a few KiB at a time while the lines are still in
		// the cache, rather than encoded whole and then read again.
		enc      []byte
		gz       *chunkCompressor // the open chunk's, nil between chunks
		chunkLen int              // the open chunk's encoded bytes
		index    int
		written  int64 // event bytes recorded so far
		capped   bool
		prev     string
	)
	open := func() {
		if gz == nil {
			gz = newChunkCompressor()
			if index == 0 {
				gz.write(header)
				chunkLen = len(header)
			}
		}
	}
	flush := func() {
		if len(enc) > 0 {
			gz.write(enc)
			enc = enc[:0]
		}
	}
	closeChunk := func(final bool) {
		flush()
		data, err := gz.close()
		gz, chunkLen = nil, 0
		if w.sinkErr != nil {
			// Nothing is stored after a failure: a later chunk would
			// leave a hole that verification reads as tampering.
			index++
			return
		}
		if err == nil {
			var h string
			h, err = ChainHash(prev, data)
			if err == nil {
				err = w.cfg.Sink.WriteChunk(Chunk{Index: index, Hash: h, Final: final, Data: data})
				prev = h
			}
		}
		index++
		if err != nil && w.sinkErr == nil {
			w.fail(err, "Storing a recording chunk failed.")
		}
	}
	for b := range w.queue {
		enc = encPool.Get().([]byte)[:0]
		for rest := b.raw; len(rest) > 0 && !capped; {
			var t float64
			var code byte
			var data []byte
			t, code, data, rest = nextRaw(rest)
			open()
			n0 := len(enc)
			enc = appendEvent(enc, t, eventCodes[code], data)
			if n := int64(len(enc) - n0); written+n <= w.cfg.MaxBytes {
				written += n
				chunkLen += int(n)
				switch {
				case chunkLen >= w.cfg.ChunkBytes:
					closeChunk(false)
				case len(enc) >= encFlushBytes:
					flush()
				}
				continue
			}
			enc = enc[:n0]
			capped = true
			w.capped.Store(true)
			enc = appendEvent(enc, t, "m", []byte("recording stopped: max_recording_bytes ("+strconv.FormatInt(w.cfg.MaxBytes, 10)+") reached"))
			closeChunk(false)
			if w.cfg.OnCap != nil {
				w.cfg.OnCap()
			}
		}
		if c := cap(b.raw); c > 0 && c <= DefaultChunkBytes+64<<10 {
			//lint:ignore SA6002 one slice header per batch is cheap
			rawPool.Put(b.raw[:0])
		}
		switch {
		case b.final:
			open()
			if b.exit != "" {
				enc = appendEvent(enc, b.at, "m", []byte(b.exit))
				chunkLen++
			}
			if chunkLen == 0 {
				// A chunk must decode to whole lines: the final mark
				// rides on a marker of its own.
				enc = appendEvent(enc, b.at, "m", []byte("end"))
			}
			closeChunk(true)
		case gz != nil:
			closeChunk(false)
		case b.synced != nil && index == 0:
			// Sync before any event: the header is chunk 0 of its own,
			// stored now, so that a spool that cannot be written is
			// known before the session starts.
			open()
			closeChunk(false)
		}
		if b.synced != nil {
			b.synced <- w.sinkErr
		}
		// Every batch ends a chunk: between batches (an idle session)
		// store holds no buffer.
		if cap(enc) <= encPoolCap {
			//lint:ignore SA6002 one slice header per batch is cheap
			encPool.Put(enc[:0])
		}
		enc = nil
	}
	w.finalHex = prev
	// A sink with files open (SpoolSink) syncs and closes them now: the
	// final chunk is written, and Close must not return before it is
	// durable.
	if c, ok := w.cfg.Sink.(io.Closer); ok {
		if err := c.Close(); err != nil && w.sinkErr == nil {
			w.fail(err, "Syncing a recording failed.")
		}
	}
}

// fail notes the first storing error (store only): recording stops, and
// OnFail is told.
func (w *Writer) fail(err error, msg string) {
	w.sinkErr = err
	w.failed.Store(true)
	w.cfg.Logger.WithError(err).WithField("session_id", w.cfg.Header.SessionID).Warn(msg)
	if w.cfg.OnFail != nil {
		w.cfg.OnFail(err)
	}
}

// Sync stores what was recorded so far (the header at least, as chunk 0
// when nothing else was recorded) and returns the first storing error.
// A session whose recording must not fail calls it before its process
// starts: a spool that cannot be written refuses the session rather than
// letting it run unrecorded.
func (w *Writer) Sync() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return trace.BadParameter("recording is closed")
	}
	done := make(chan error, 1)
	w.handOffLocked(batch{synced: done})
	w.mu.Unlock()
	return trace.Wrap(<-done)
}

// Close ends the recording with exitLabel as a last marker (empty: none;
// it is recorded even after the cap) and returns the final hash once
// every chunk is stored.
func (w *Writer) Close(exitLabel string) (string, error) {
	w.mu.Lock()
	if !w.closed {
		w.handOffLocked(batch{final: true, exit: exitLabel, at: w.nowLocked()})
		w.closed = true
		close(w.queue)
	}
	w.mu.Unlock()
	<-w.stored
	return w.finalHex, trace.Wrap(w.sinkErr)
}

// MaxBytes is the cap in effect (Config.MaxBytes, or DefaultMaxBytes when
// that was zero).
func (w *Writer) MaxBytes() int64 { return w.cfg.MaxBytes }

// Failed reports whether a chunk could not be stored (recording stopped
// there; Close returns the error).
func (w *Writer) Failed() bool { return w.failed.Load() }

// Capped reports whether MaxBytes stopped the recording (as far as the
// store goroutine has got; final once Close has returned).
func (w *Writer) Capped() bool { return w.capped.Load() }
