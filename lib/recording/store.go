package recording

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
)

// sessionIDPattern is what a session id may look like on disk: the
// uuid.NewString form, so that an id from the network can never name a
// path outside the store.
var sessionIDPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// CheckSessionID refuses ids that are not session uuids.
func CheckSessionID(id string) error {
	if !sessionIDPattern.MatchString(id) {
		return trace.BadParameter("recording id %q is not a session id", id)
	}
	return nil
}

// Meta describes a stored recording for listings.
type Meta struct {
	Header
	Chunks   int  `json:"chunks"`
	Complete bool `json:"complete"`
}

// Storage is where the auth server keeps recordings. DirStorage is the
// disk one; an S3-compatible store implements the same four calls.
// Readers stream a recording chunk by chunk (ChunkIndexes, GetChunk), so
// a long recording is never held in memory whole.
type Storage interface {
	PutChunk(ctx context.Context, session string, c Chunk) error
	ChunkIndexes(ctx context.Context, session string) ([]int, error)
	GetChunk(ctx context.Context, session string, i int) (*Chunk, error)
	GetMeta(ctx context.Context, session string) (*Meta, error)
	List(ctx context.Context) ([]Meta, error)
}

// DirStorage keeps one directory per session. The auth server's store
// has one file per chunk (NNNNNNNN.chunk, the Chunk as JSON); the node's
// spool (DATA_DIR/recordings) has segment files of many chunks
// (spool.go), and an older node's spool chunk files. DirStorage reads
// both layouts.
type DirStorage struct{ Dir string }

var (
	_ Storage = DirStorage{}
	_ Sink    = (*DirSink)(nil)
)

func chunkName(i int) string { return fmt.Sprintf("%08d.chunk", i) }

// PutChunk writes c atomically (temp file, fsync, rename): a crash leaves
// the chunk whole or absent.
func (d DirStorage) PutChunk(_ context.Context, session string, c Chunk) error {
	_, err := d.putChunk(session, c, true)
	return trace.Wrap(err)
}

// putChunk writes c through a temp file renamed into place, with an fsync
// before the rename when sync is set; it returns the chunk's path.
func (d DirStorage) putChunk(session string, c Chunk, sync bool) (string, error) {
	if err := CheckSessionID(session); err != nil {
		return "", trace.Wrap(err)
	}
	if c.Index < 0 {
		return "", trace.BadParameter("chunk index %d", c.Index)
	}
	dir := filepath.Join(d.Dir, session)
	data, err := appendChunkJSON(make([]byte, 0, base64.StdEncoding.EncodedLen(len(c.Data))+len(c.Hash)+64), c)
	if err != nil {
		return "", trace.Wrap(err)
	}
	// The session's directory exists from its first chunk on: it is made
	// only when the temp file cannot be created for want of it (a stat per
	// chunk showed in the recorded session's profile).
	f, err := os.CreateTemp(dir, ".tmp-*")
	if os.IsNotExist(err) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", trace.ConvertSystemError(err)
		}
		f, err = os.CreateTemp(dir, ".tmp-*")
	}
	if err != nil {
		return "", trace.ConvertSystemError(err)
	}
	// The temp file is removed unless it was renamed into place (an
	// unlink of a name that is gone was one more syscall per chunk).
	renamed := false
	defer func() {
		if !renamed {
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return "", trace.ConvertSystemError(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return "", trace.ConvertSystemError(err)
		}
	}
	if err := f.Close(); err != nil {
		return "", trace.ConvertSystemError(err)
	}
	path := filepath.Join(dir, chunkName(c.Index))
	if err := os.Rename(f.Name(), path); err != nil {
		return "", trace.ConvertSystemError(err)
	}
	renamed = true
	return path, nil
}

// ChunkIndexes lists the chunk indexes stored for session, ascending:
// chunk files and the whole lines of segments (spool.go). A session with
// no directory is NotFound.
func (d DirStorage) ChunkIndexes(_ context.Context, session string) ([]int, error) {
	out, segs, err := d.sessionFiles(session)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for _, first := range segs {
		idx, err := d.segmentIndexes(session, first)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		out = append(out, idx...)
	}
	sort.Ints(out)
	return out, nil
}

// GetChunk reads one chunk, from its chunk file or its segment; its
// stored index must match where it was found.
func (d DirStorage) GetChunk(_ context.Context, session string, i int) (*Chunk, error) {
	if err := CheckSessionID(session); err != nil {
		return nil, trace.Wrap(err)
	}
	data, err := os.ReadFile(filepath.Join(d.Dir, session, chunkName(i)))
	if os.IsNotExist(err) {
		c, err := d.segmentChunk(session, i)
		return c, trace.Wrap(err)
	}
	if err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	var c Chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, trace.BadParameter("chunk %d of %s is unreadable: %v", i, session, err)
	}
	if c.Index != i {
		return nil, trace.BadParameter("chunk file %d of %s says it is chunk %d", i, session, c.Index)
	}
	return &c, nil
}

// appendChunkJSON appends c as json.Marshal writes it (the chunk file
// format is unchanged), without reflection or its intermediate copies of
// the base64. A hash that is not plain text (never ours: ours are hex)
// goes through json.Marshal.
func appendChunkJSON(dst []byte, c Chunk) ([]byte, error) {
	for i := 0; i < len(c.Hash); i++ {
		if b := c.Hash[i]; !safeASCII[b] || b == '<' || b == '>' || b == '&' {
			data, err := json.Marshal(c)
			return append(dst, data...), trace.Wrap(err)
		}
	}
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(c.Index), 10)
	dst = append(dst, `,"hash":"`...)
	dst = append(dst, c.Hash...)
	dst = append(dst, '"')
	if c.Final {
		dst = append(dst, `,"final":true`...)
	}
	if c.Data == nil {
		return append(dst, `,"data":null}`...), nil
	}
	dst = append(dst, `,"data":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, c.Data)
	return append(dst, '"', '}'), nil
}

// RemoveChunk deletes a chunk file (the node's spool, after upload).
func (d DirStorage) RemoveChunk(session string, i int) error {
	return trace.ConvertSystemError(os.Remove(filepath.Join(d.Dir, session, chunkName(i))))
}

// GetChunks reads every chunk of session (tests and small tools; servers
// stream with GetChunk).
func GetChunks(ctx context.Context, st Storage, session string) ([]Chunk, error) {
	idx, err := st.ChunkIndexes(ctx, session)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := make([]Chunk, 0, len(idx))
	for _, i := range idx {
		c, err := st.GetChunk(ctx, session, i)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		out = append(out, *c)
	}
	return out, nil
}

// GetMeta reads the header from chunk 0.
func (d DirStorage) GetMeta(ctx context.Context, session string) (*Meta, error) {
	idx, err := d.ChunkIndexes(ctx, session)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if len(idx) == 0 || idx[0] != 0 {
		return nil, trace.NotFound("recording %s has no first chunk", session)
	}
	c, err := d.GetChunk(ctx, session, 0)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	h, err := HeaderOf(c.Data)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	m := &Meta{Header: *h, Chunks: len(idx)}
	if last, err := d.GetChunk(ctx, session, idx[len(idx)-1]); err == nil {
		m.Complete = last.Final
	}
	return m, nil
}

// List returns the metadata of every stored recording, oldest first;
// recordings whose first chunk is unreadable are skipped.
func (d DirStorage) List(ctx context.Context) ([]Meta, error) {
	ents, err := os.ReadDir(d.Dir)
	if err != nil {
		if os.IsNotExist(err) {
			return []Meta{}, nil
		}
		return nil, trace.ConvertSystemError(err)
	}
	out := []Meta{}
	for _, e := range ents {
		if !e.IsDir() || CheckSessionID(e.Name()) != nil {
			continue
		}
		m, err := d.GetMeta(ctx, e.Name())
		if err != nil {
			continue
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out, nil
}

// HeaderOf decodes a first chunk's header line.
func HeaderOf(gz []byte) (*Header, error) {
	b, err := DecodeChunk(gz)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var h Header
	if err := json.Unmarshal([]byte(line), &h); err != nil {
		return nil, trace.BadParameter("recording header: %v", err)
	}
	if h.Version != 2 || h.SessionID == "" {
		return nil, trace.BadParameter("recording header is not a Postern asciicast v2 header")
	}
	return &h, nil
}

// DirSink writes one session's chunks to a DirStorage, one file per chunk
// (the auth server's layout: tools and tests that write a store directly
// use it; a node's recordings go through SpoolSink), and tells Notify that
// a chunk is ready.
//
// Durability. A chunk is in the file system (renamed into place) before
// WriteChunk returns, so a node process killed with SIGKILL loses nothing
// that was closed. The fsync that survives a machine crash is batched: the
// chunks written since the last one are synced when DefaultFlushInterval
// has passed since it (and always with the final chunk), so a burst of
// output is not paced by the disk's sync rate, and a power loss costs at
// most about two intervals.
type DirSink struct {
	Storage DirStorage
	Session string
	// Notify is called after each chunk is on disk; nil means nobody.
	Notify func()
	// Clock paces the batched fsync; nil means the real clock.
	Clock clockwork.Clock

	unsynced []string
	synced   time.Time
}

// WriteChunk stores c (calls come from one goroutine: the Writer's).
func (s *DirSink) WriteChunk(c Chunk) error {
	if s.Clock == nil {
		s.Clock = clockwork.NewRealClock()
	}
	path, err := s.Storage.putChunk(s.Session, c, false)
	if err != nil {
		return trace.Wrap(err)
	}
	s.unsynced = append(s.unsynced, path)
	if now := s.Clock.Now(); c.Final || now.Sub(s.synced) >= DefaultFlushInterval {
		if err := s.sync(); err != nil {
			return trace.Wrap(err)
		}
		s.synced = now
	}
	if s.Notify != nil {
		s.Notify()
	}
	return nil
}

// sync fsyncs the chunks written since the last sync and their directory.
func (s *DirSink) sync() error {
	for _, p := range s.unsynced {
		if err := syncPath(p); err != nil && !os.IsNotExist(err) {
			return trace.ConvertSystemError(err)
		}
	}
	s.unsynced = s.unsynced[:0]
	err := syncPath(filepath.Join(s.Storage.Dir, s.Session))
	if os.IsNotExist(err) {
		// The uploader shipped the session and removed its directory.
		return nil
	}
	return trace.ConvertSystemError(err)
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
