package recording

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
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

// Sink stores closed chunks; DirSink writes them to disk.
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
	// Clock times events and the flush interval. Nil means the real clock.
	Clock clockwork.Clock
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
	// audit event), from the goroutine whose event hit the cap, without the
	// writer's lock held. Nil means nothing is called.
	OnCap func()
	// Logger: nil means component=recording.
	Logger logrus.FieldLogger
}

// CheckAndSetDefaults validates c.
func (c *Config) CheckAndSetDefaults() error {
	if c.Header.SessionID == "" {
		return trace.BadParameter("recording: missing Header.SessionID")
	}
	if c.Sink == nil {
		return trace.BadParameter("recording: missing Sink")
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.ChunkBytes <= 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Logger == nil {
		c.Logger = logrus.WithField("component", "recording")
	}
	return nil
}

// Writer records one session. Its methods are safe for concurrent use
// (the pty copy, the request loop and the flush timer call them).
type Writer struct {
	cfg   Config
	start time.Time

	// mu guards everything below; held while a chunk is compressed and
	// handed to the sink (a disk write), never while waiting on the network.
	mu       sync.Mutex
	buf      []byte
	last     float64 // last event time, so times never go back
	index    int
	written  int64 // event bytes recorded so far
	capped   bool
	closed   bool
	timer    clockwork.Timer // flush timer, armed while buf holds events
	finalHex string

	// Closed chunks are compressed, hashed and stored by one goroutine
	// (store), in order, so that the session's output copy never waits
	// on gzip or fsync; queue bounds how far it may fall behind (then the
	// copy waits: memory stays bounded).
	queue  chan pendingChunk
	stored chan struct{} // closed when store has returned
	// sinkErr is the first storing error; read after stored is closed.
	sinkErr error
}

// pendingChunk is a closed chunk on its way to the sink.
type pendingChunk struct {
	index int
	final bool
	data  []byte
}

// storeQueue is how many closed chunks may wait for the store goroutine:
// with DefaultChunkBytes, about a MiB.
const storeQueue = 4

// New starts a recording: the header goes into the first chunk.
func New(cfg Config) (*Writer, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	w := &Writer{cfg: cfg, start: cfg.Clock.Now(), queue: make(chan pendingChunk, storeQueue), stored: make(chan struct{})}
	go w.store()
	h := cfg.Header
	h.Version = 2
	h.Timestamp = w.start.Unix()
	line, err := json.Marshal(h)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(append(w.buf, line...), '\n')
	w.armLocked()
	return w, nil
}

// Output records terminal output.
func (w *Writer) Output(p []byte) { w.event("o", p) }

// Input records terminal input when RecordInput is on.
func (w *Writer) Input(p []byte) {
	if w.cfg.RecordInput {
		w.event("i", p)
	}
}

// Resize records a terminal size change.
func (w *Writer) Resize(cols, rows uint32) {
	w.event("r", []byte(fmt.Sprintf("%dx%d", cols, rows)))
}

// Marker records a named point (exec command, sftp, agent, exit status).
func (w *Writer) Marker(label string) { w.event("m", []byte(label)) }

func (w *Writer) event(code string, data []byte) {
	if w.eventLocking(code, data) && w.cfg.OnCap != nil {
		w.cfg.OnCap()
	}
}

// eventLocking records one event and reports whether it hit the cap.
// The event is encoded straight into the chunk buffer (no copy of the
// pty read, no scratch line): this runs on every read of a recorded
// session's output.
func (w *Writer) eventLocking(code string, data []byte) (capped bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.capped {
		return false
	}
	n0 := len(w.buf)
	w.buf = w.appendLineLocked(w.buf, code, data)
	n := int64(len(w.buf) - n0)
	if w.written+n > w.cfg.MaxBytes {
		w.buf = w.buf[:n0]
		w.capped = true
		w.buf = w.appendLineLocked(w.buf, "m", []byte("recording stopped: max_recording_bytes ("+strconv.FormatInt(w.cfg.MaxBytes, 10)+") reached"))
		w.flushLocked(false)
		return true
	}
	w.written += n
	if len(w.buf) >= w.cfg.ChunkBytes {
		w.flushLocked(false)
		return false
	}
	w.armLocked()
	return false
}

// appendLineLocked appends one event to dst, timed now (never before the
// previous event).
func (w *Writer) appendLineLocked(dst []byte, code string, data []byte) []byte {
	t := w.cfg.Clock.Since(w.start).Seconds()
	if t < w.last {
		t = w.last
	}
	w.last = t
	return appendEvent(dst, t, code, data)
}

// appendEvent appends `[TIME,"CODE","DATA"]\n`: what json.Marshal would
// write, less its HTML escaping (a terminal's `<` stays one byte), by hand
// because this runs on every pty read of a recorded session. Output is
// bytes and asciicast wants a string, so each byte that is not part of
// valid UTF-8 (a split multi-byte rune, binary) becomes U+FFFD, as
// asciinema itself does (and as ranging over a Go string does: recordings
// written before this fast path are byte for byte the same).
//
// Terminal output is mostly printable ASCII, so runs of it are skipped
// eight bytes at a time (safeWord) and copied in one append.
func appendEvent(dst []byte, t float64, code string, p []byte) []byte {
	dst = append(dst, '[')
	dst = strconv.AppendFloat(dst, t, 'f', 6, 64)
	dst = append(dst, ',', '"')
	dst = append(dst, code...)
	dst = append(dst, '"', ',', '"')
	start := 0
	for i := 0; i < len(p); {
		if i+8 <= len(p) && safeWord(binary.LittleEndian.Uint64(p[i:])) {
			i += 8
			continue
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
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, p[start:]...)
	return append(dst, '"', ']', '\n')
}

const hexDigits = "0123456789abcdef"

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

// safeWord reports whether all eight bytes of v are safeASCII: none has
// its high bit set, none is below 0x20, none is '"' or '\\'.
func safeWord(v uint64) bool {
	below := (v - 0x20*lo) &^ v      // high bit set where a byte < 0x20 (or >= 0x80)
	quote := v ^ '"'*lo              // zero where a byte is '"'
	quote = (quote - lo) &^ quote    // high bit set there
	bslash := v ^ '\\'*lo            // zero where a byte is '\\'
	bslash = (bslash - lo) &^ bslash // high bit set there
	return (v|below|quote|bslash)&hi == 0
}

func (w *Writer) armLocked() {
	if w.timer == nil && len(w.buf) > 0 {
		w.timer = w.cfg.Clock.AfterFunc(w.cfg.FlushInterval, w.onTimer)
	}
}

func (w *Writer) onTimer() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = nil
	if !w.closed {
		w.flushLocked(false)
	}
}

// flushLocked closes the buffered events into a chunk and hands it to the
// sink. A final flush writes a chunk even when nothing is buffered, so the
// final mark always exists.
func (w *Writer) flushLocked(final bool) {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	if len(w.buf) == 0 && !final {
		return
	}
	if len(w.buf) == 0 {
		// A chunk must decode to whole lines: the final mark rides on a
		// marker of its own.
		w.buf = w.appendLineLocked(w.buf, "m", []byte("end"))
	}
	w.queue <- pendingChunk{index: w.index, final: final, data: w.buf}
	w.index++
	w.buf = bufPool.Get().([]byte)[:0]
}

// bufPool recycles chunk buffers between the writer and store.
var bufPool = sync.Pool{New: func() any { return make([]byte, 0, DefaultChunkBytes+64<<10) }}

// store compresses, chains and stores the closed chunks in order. After a
// storing error it keeps chaining (the hashes stay right for what was
// stored before) but reports the first error at Close.
func (w *Writer) store() {
	defer close(w.stored)
	prev := ""
	for p := range w.queue {
		gz, err := compress(p.data)
		if cap(p.data) <= DefaultChunkBytes+64<<10 {
			//lint:ignore SA6002 one slice header per 256 KiB chunk is cheap
			bufPool.Put(p.data[:0])
		}
		if err == nil {
			var h string
			h, err = ChainHash(prev, gz)
			if err == nil {
				err = w.cfg.Sink.WriteChunk(Chunk{Index: p.index, Hash: h, Final: p.final, Data: gz})
				prev = h
			}
		}
		if err != nil && w.sinkErr == nil {
			w.sinkErr = err
			w.cfg.Logger.WithError(err).WithField("session_id", w.cfg.Header.SessionID).Warn("Storing a recording chunk failed.")
		}
		w.finalHex = prev
	}
}

// Close ends the recording with exitLabel as a last marker (empty: none)
// and returns the final hash.
func (w *Writer) Close(exitLabel string) (string, error) {
	w.mu.Lock()
	if !w.closed {
		if exitLabel != "" {
			w.buf = w.appendLineLocked(w.buf, "m", []byte(exitLabel))
		}
		w.flushLocked(true)
		w.closed = true
		close(w.queue)
	}
	w.mu.Unlock()
	// Every chunk is stored (or failed) once store returns.
	<-w.stored
	return w.finalHex, trace.Wrap(w.sinkErr)
}

// Capped reports whether MaxBytes stopped the recording.
func (w *Writer) Capped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.capped
}
