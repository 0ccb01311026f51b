package recording

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
)

// The node's spool keeps a session's chunks in segment files rather than
// one file per chunk. At a busy session's output rate a chunk closes every
// few milliseconds (256 KiB), and creating, writing and renaming a file
// per chunk, then fsyncing each one, cost more than the recording itself:
// the session's output waited on the file system. A segment is appended
// to, one write per chunk, and synced once per flush interval.
//
// A segment is named after its first chunk (NNNNNNNN.seg) and holds
// consecutive chunks, one per line, each line the chunk's JSON exactly as
// a chunk file holds it (base64 has no newline). Only whole lines count: a
// node killed in the middle of a write leaves at most a torn last line,
// which readers ignore (it was never a closed chunk). The auth server's
// store keeps one file per chunk (DirStorage.PutChunk); DirStorage reads
// both layouts, so the spool of an older node (chunk files) is still
// uploaded after an upgrade.
const (
	segmentSuffix = ".seg"
	// segmentBytes and segmentChunks bound a segment, so that the uploader
	// can delete what auth already has while a long session still runs,
	// and a restarted node re-sends at most one segment.
	segmentBytes  = 4 << 20
	segmentChunks = 64
)

func segmentName(first int) string { return fmt.Sprintf("%08d%s", first, segmentSuffix) }

// sessionFiles lists a session directory: chunk files and segments by
// their (first) chunk index, ascending.
func (d DirStorage) sessionFiles(session string) (chunks, segments []int, err error) {
	if err := CheckSessionID(session); err != nil {
		return nil, nil, trace.Wrap(err)
	}
	ents, err := os.ReadDir(filepath.Join(d.Dir, session))
	if err != nil {
		return nil, nil, trace.ConvertSystemError(err)
	}
	for _, e := range ents {
		name := e.Name()
		list := &chunks
		if base, ok := strings.CutSuffix(name, segmentSuffix); ok {
			name, list = base, &segments
		} else if base, ok := strings.CutSuffix(name, ".chunk"); ok {
			name = base
		} else {
			continue
		}
		n, err := strconv.Atoi(name)
		if err != nil || n < 0 {
			continue
		}
		*list = append(*list, n)
	}
	sort.Ints(chunks)
	sort.Ints(segments)
	return chunks, segments, nil
}

// wholeLines calls fn with each newline-terminated line of data (without
// the newline) and returns how many bytes those lines took: a torn last
// line is not a record.
func wholeLines(data []byte, fn func(line []byte) error) (int, error) {
	off := 0
	for {
		n := bytes.IndexByte(data[off:], '\n')
		if n < 0 {
			return off, nil
		}
		if err := fn(data[off : off+n]); err != nil {
			return off, trace.Wrap(err)
		}
		off += n + 1
	}
}

// recordIndex reads a segment line's chunk index from its start
// (`{"index":N,`) without decoding the base64 behind it.
func recordIndex(line []byte) (int, bool) {
	rest, ok := bytes.CutPrefix(line, []byte(`{"index":`))
	if !ok {
		return 0, false
	}
	end := bytes.IndexByte(rest, ',')
	if end < 0 {
		return 0, false
	}
	n, err := strconv.Atoi(string(rest[:end]))
	return n, err == nil && n >= 0
}

// segmentIndexes lists the chunk indexes of a segment's whole lines.
func (d DirStorage) segmentIndexes(session string, first int) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(d.Dir, session, segmentName(first)))
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	var out []int
	_, err = wholeLines(data, func(line []byte) error {
		if i, ok := recordIndex(line); ok {
			out = append(out, i)
		}
		return nil
	})
	return out, trace.Wrap(err)
}

// segmentChunk finds chunk i in the segment that would hold it.
func (d DirStorage) segmentChunk(session string, i int) (*Chunk, error) {
	_, segs, err := d.sessionFiles(session)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	k := sort.SearchInts(segs, i+1) - 1 // the last segment starting at or before i
	if k < 0 {
		return nil, trace.NotFound("chunk %d of %s is not stored", i, session)
	}
	data, err := os.ReadFile(filepath.Join(d.Dir, session, segmentName(segs[k])))
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	var found *Chunk
	errFound := fmt.Errorf("found")
	_, err = wholeLines(data, func(line []byte) error {
		if n, ok := recordIndex(line); !ok || n != i {
			return nil
		}
		var c Chunk
		if err := json.Unmarshal(line, &c); err != nil {
			return trace.BadParameter("chunk %d of %s is unreadable: %v", i, session, err)
		}
		found = &c
		return errFound
	})
	if found != nil {
		return found, nil
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return nil, trace.NotFound("chunk %d of %s is not stored", i, session)
}

// SpoolSink writes one session's chunks into segment files in a
// DirStorage (the node's spool) and tells Notify (the uploader) that a
// chunk is ready. Calls come from one goroutine (the Writer's store).
//
// Durability. A chunk is written (appended to its segment) before
// WriteChunk returns, so a node process killed with SIGKILL loses nothing
// that was closed: the data is in the kernel. The fsync that survives a
// machine crash runs on a goroutine of its own, once per
// DefaultFlushInterval, so neither the session's output nor the next chunk
// waits for the disk; Close (after the final chunk) syncs everything and
// waits. A power loss costs at most about two intervals.
type SpoolSink struct {
	Storage DirStorage
	Session string
	// Notify is called after each chunk is written; nil means nobody.
	Notify func()
	// Clock paces the batched fsync; nil means the real clock.
	Clock clockwork.Clock

	lock   *os.File // the session's lock file, held while writing
	f      *os.File // the segment being appended to
	size   int64    // its length
	chunks int      // chunks in it
	line   []byte   // the encoding buffer, reused

	// Written since the last sync began: the files to sync, those among
	// them no longer written (closed after their sync), and whether a new
	// segment's name needs the directory synced.
	dirty   []*os.File
	retired []*os.File
	dirNew  bool

	syncing  *pendingSync // the sync in flight, nil when none
	synced   time.Time    // when the last sync began
	firstErr error
}

var _ Sink = (*SpoolSink)(nil)

// pendingSync is one batched fsync on its own goroutine.
type pendingSync struct {
	done chan struct{}
	err  error // read after done is closed
}

// WriteChunk appends c to the current segment, starting a new one when
// the current one is full.
func (s *SpoolSink) WriteChunk(c Chunk) error {
	if s.Clock == nil {
		s.Clock = clockwork.NewRealClock()
	}
	if err := s.writeChunk(c); err != nil {
		return trace.Wrap(err)
	}
	if now := s.Clock.Now(); now.Sub(s.synced) >= DefaultFlushInterval && s.syncIdle() {
		s.startSync()
		s.synced = now
	}
	if s.Notify != nil {
		s.Notify()
	}
	return nil
}

func (s *SpoolSink) writeChunk(c Chunk) error {
	if err := CheckSessionID(s.Session); err != nil {
		return trace.Wrap(err)
	}
	if c.Index < 0 {
		return trace.BadParameter("chunk index %d", c.Index)
	}
	if s.f == nil || s.size >= segmentBytes || s.chunks >= segmentChunks {
		if err := s.openSegment(c.Index); err != nil {
			return trace.Wrap(err)
		}
	}
	var err error
	s.line, err = appendChunkJSON(s.line[:0], c)
	if err != nil {
		return trace.Wrap(err)
	}
	s.line = append(s.line, '\n')
	if _, err := s.f.Write(s.line); err != nil {
		// A torn line must not run into the next chunk's: cut it off, or
		// failing that, give up this segment (the next chunk starts a
		// new one; the lost chunk shows as missing).
		if s.f.Truncate(s.size) != nil {
			s.retire()
		}
		return trace.ConvertSystemError(err)
	}
	s.size += int64(len(s.line))
	s.chunks++
	if len(s.dirty) == 0 || s.dirty[len(s.dirty)-1] != s.f {
		s.dirty = append(s.dirty, s.f)
	}
	return nil
}

// openSegment retires the current segment and starts one at chunk first.
func (s *SpoolSink) openSegment(first int) error {
	s.retire()
	dir := filepath.Join(s.Storage.Dir, s.Session)
	path := filepath.Join(dir, segmentName(first))
	const flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL | os.O_APPEND
	if s.lock == nil {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return trace.ConvertSystemError(err)
		}
		lock, err := createLock(dir)
		if err != nil {
			return trace.Wrap(err)
		}
		s.lock = lock
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	s.f, s.size, s.chunks, s.dirNew = f, 0, 0, true
	return nil
}

// retire stops writing the current segment; it is closed after its next
// sync (right away when nothing of it is unsynced).
func (s *SpoolSink) retire() {
	if s.f == nil {
		return
	}
	for _, d := range s.dirty {
		if d == s.f {
			s.retired = append(s.retired, s.f)
			s.f = nil
			return
		}
	}
	_ = s.f.Close()
	s.f = nil
}

// syncIdle reports whether no sync is in flight, collecting the error of
// the last one.
func (s *SpoolSink) syncIdle() bool {
	if s.syncing == nil {
		return true
	}
	select {
	case <-s.syncing.done:
		s.noteErr(s.syncing.err)
		s.syncing = nil
		return true
	default:
		return false
	}
}

func (s *SpoolSink) noteErr(err error) {
	if err != nil && s.firstErr == nil {
		s.firstErr = err
	}
}

// startSync hands what was written since the last sync to a goroutine of
// its own. Writing goes on meanwhile (an fsync and a write to the same
// file may run at once).
func (s *SpoolSink) startSync() {
	files, closeAfter, dir := s.dirty, s.retired, ""
	if s.dirNew {
		dir = filepath.Join(s.Storage.Dir, s.Session)
	}
	s.dirty, s.retired, s.dirNew = nil, nil, false
	p := &pendingSync{done: make(chan struct{})}
	s.syncing = p
	go func() {
		defer close(p.done)
		p.err = syncFiles(files, closeAfter, dir)
	}()
}

// syncFiles fsyncs files and then dir (when set), and closes closeAfter
// (a subset of files) once synced.
func syncFiles(files, closeAfter []*os.File, dir string) error {
	var first error
	for _, f := range files {
		if err := f.Sync(); err != nil && first == nil {
			first = trace.ConvertSystemError(err)
		}
	}
	for _, f := range closeAfter {
		if err := f.Close(); err != nil && first == nil {
			first = trace.ConvertSystemError(err)
		}
	}
	if dir != "" {
		err := syncPath(dir)
		if err != nil && !os.IsNotExist(err) && first == nil {
			// (A missing directory: the uploader already shipped the
			// session and removed it.)
			first = trace.ConvertSystemError(err)
		}
	}
	return first
}

// Close syncs and closes everything once the final chunk is written (the
// Writer calls it when its store goroutine ends) and returns the first
// storing error of the background syncs.
func (s *SpoolSink) Close() error {
	if s.syncing != nil {
		<-s.syncing.done
		s.noteErr(s.syncing.err)
		s.syncing = nil
	}
	s.retire()
	dir := ""
	if s.dirNew {
		dir = filepath.Join(s.Storage.Dir, s.Session)
	}
	s.noteErr(syncFiles(s.dirty, s.retired, dir))
	s.dirty, s.retired, s.dirNew = nil, nil, false
	if s.lock != nil {
		// The recording is done: the uploader may treat what is left as
		// a dead writer's.
		_ = s.lock.Close()
		s.lock = nil
	}
	return trace.Wrap(s.firstErr)
}

// lockName is a spooled session's lock file. Its writer (a SpoolSink)
// holds an flock on it from the first chunk to Close; a session whose
// lock file is there and not held was left by a writer that is gone (a
// killed node), so nothing more will be appended to it.
const lockName = ".lock"

// createLock makes dir's lock file, locked before it appears under its
// name (made under a temporary name and renamed), so that the uploader
// never finds it unheld while its writer lives.
func createLock(dir string) (*os.File, error) {
	f, err := os.CreateTemp(dir, ".lock-*")
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	// A file system without flock (some network ones) still records: the
	// lock then only fails the uploader's test too, and it leaves a dead
	// writer's shipped remains in the spool rather than risk a live one.
	_, _ = tryLock(f)
	if err := os.Rename(f.Name(), filepath.Join(dir, lockName)); err != nil {
		f.Close()
		_ = os.Remove(f.Name())
		return nil, trace.ConvertSystemError(err)
	}
	return f, nil
}

// writerGone reports whether session's writer is gone: its lock file is
// there and can be locked. The lock taken is returned to be closed after
// the session is removed.
func (d DirStorage) writerGone(session string) (*os.File, bool) {
	f, err := os.Open(filepath.Join(d.Dir, session, lockName))
	if err != nil {
		return nil, false
	}
	ok, err := tryLock(f)
	if err != nil || !ok {
		f.Close()
		return nil, false
	}
	return f, true
}

// segmentReader is the uploader's place in a session's segments, so that
// each scan reads only what was appended since the last one.
type segmentReader struct {
	first int   // the segment being read
	off   int64 // bytes of it already shipped
}

// readSegmentFrom returns segment first from byte off on (whole lines
// and perhaps a torn last one, which the caller leaves for later).
func (d DirStorage) readSegmentFrom(session string, first int, off int64) ([]byte, error) {
	f, err := os.Open(filepath.Join(d.Dir, session, segmentName(first)))
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	data, err := io.ReadAll(f)
	return data, trace.ConvertSystemError(err)
}
