package recording

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
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

// ChunkRef names a stored chunk by its index and chained hash: what a
// store answers to "what do you have of session X" (LastChunk), so that
// a node resuming an upload (after a restart, or a failover to another
// auth server of the cluster) continues from what the store holds.
type ChunkRef struct {
	Index int    `json:"index"`
	Hash  string `json:"hash"`
	Final bool   `json:"final,omitempty"`
}

// Storage is where the auth server keeps recordings: DirStorage on one
// machine, an S3-compatible bucket (lib/recording/s3store) that every
// auth server of a cluster shares. Readers stream a recording chunk by
// chunk (ChunkIndexes, GetChunk), so a long recording is never held in
// memory whole.
//
// Stored chunks never change. PutChunk stores chunk c.Index only if no
// chunk of that index is stored; when one is, it returns nil if it is the
// same chunk (a retried upload) and trace.AlreadyExists otherwise. That
// holds across processes sharing the store (the bucket's conditional
// write, a hard link in a directory), so two auth servers receiving the
// same session's chunks (a node failing over mid-upload) can never
// replace one another's.
type Storage interface {
	PutChunk(ctx context.Context, session string, c Chunk) error
	ChunkIndexes(ctx context.Context, session string) ([]int, error)
	GetChunk(ctx context.Context, session string, i int) (*Chunk, error)
	GetMeta(ctx context.Context, session string) (*Meta, error)
	List(ctx context.Context) ([]Meta, error)
	// LastChunk is the highest-indexed stored chunk of session
	// (NotFound when none is).
	LastChunk(ctx context.Context, session string) (*ChunkRef, error)
	// DeleteRecording removes every chunk of session (retention); a
	// session with nothing stored is not an error.
	DeleteRecording(ctx context.Context, session string) error
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

// PutChunk writes c atomically and exclusively: a temp file, fsynced,
// hard-linked to the chunk's name (link fails when the name exists, where
// a rename would replace it), so a crash leaves the chunk whole or absent
// and a stored chunk is never overwritten (Storage).
func (d DirStorage) PutChunk(_ context.Context, session string, c Chunk) error {
	if err := CheckSessionID(session); err != nil {
		return trace.Wrap(err)
	}
	if c.Index < 0 {
		return trace.BadParameter("chunk index %d", c.Index)
	}
	data, err := appendChunkJSON(make([]byte, 0, base64.StdEncoding.EncodedLen(len(c.Data))+len(c.Hash)+64), c)
	if err != nil {
		return trace.Wrap(err)
	}
	dir := filepath.Join(d.Dir, session)
	tmp, err := writeTemp(dir, data, true)
	if err != nil {
		return trace.Wrap(err)
	}
	defer os.Remove(tmp)
	path := filepath.Join(dir, chunkName(c.Index))
	err = os.Link(tmp, path)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrExist):
		have, err := os.ReadFile(path)
		if err != nil {
			return trace.ConvertSystemError(err)
		}
		return trace.Wrap(SameChunk(session, c, have))
	default:
		return trace.ConvertSystemError(err)
	}
}

// SameChunk compares an incoming chunk with the stored bytes of the one
// of its index: nil when they are the same chunk, AlreadyExists when not.
func SameChunk(session string, c Chunk, stored []byte) error {
	var have Chunk
	if err := json.Unmarshal(stored, &have); err == nil &&
		have.Index == c.Index && have.Hash == c.Hash && have.Final == c.Final && bytes.Equal(have.Data, c.Data) {
		return nil
	}
	return trace.AlreadyExists("chunk %d of %s is already stored with other content", c.Index, session)
}

// writeTemp writes data to a new temp file in dir (made when missing),
// fsynced when sync is set, and returns its path.
func writeTemp(dir string, data []byte, sync bool) (string, error) {
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
	_, err = f.Write(data)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", trace.ConvertSystemError(err)
	}
	return f.Name(), nil
}

// putChunk writes c through a temp file renamed into place (replacing a
// file of that name: DirSink, the writer's own directory), with an fsync
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
	tmp, err := writeTemp(dir, data, sync)
	if err != nil {
		return "", trace.Wrap(err)
	}
	path := filepath.Join(dir, chunkName(c.Index))
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return "", trace.ConvertSystemError(err)
	}
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

// LastChunk reads the highest-indexed stored chunk of session.
func (d DirStorage) LastChunk(ctx context.Context, session string) (*ChunkRef, error) {
	idx, err := d.ChunkIndexes(ctx, session)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if len(idx) == 0 {
		return nil, trace.NotFound("recording %s has no chunks", session)
	}
	c, err := d.GetChunk(ctx, session, idx[len(idx)-1])
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &ChunkRef{Index: c.Index, Hash: c.Hash, Final: c.Final}, nil
}

// DeleteRecording removes the session's directory.
func (d DirStorage) DeleteRecording(_ context.Context, session string) error {
	if err := CheckSessionID(session); err != nil {
		return trace.Wrap(err)
	}
	return trace.ConvertSystemError(os.RemoveAll(filepath.Join(d.Dir, session)))
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
