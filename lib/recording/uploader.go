package recording

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
)

// ChunkUploader ships one chunk to the auth server (auth.Client).
type ChunkUploader interface {
	PutRecordingChunk(ctx context.Context, session string, c Chunk) error
}

// DefaultRetryInterval is how often the uploader retries while the auth
// server is unreachable (and rescans the spool).
const DefaultRetryInterval = 5 * time.Second

// UploaderConfig configures an Uploader.
type UploaderConfig struct {
	// Spool is the node's DATA_DIR/recordings. Required.
	Spool DirStorage
	// Upload sends chunks to auth. Required.
	Upload ChunkUploader
	// Clock drives retries; nil means the real clock.
	Clock clockwork.Clock
	// RetryInterval: zero means DefaultRetryInterval.
	RetryInterval time.Duration
	// Logger: nil means component=recording:upload.
	Logger logrus.FieldLogger
}

// Uploader ships closed chunks from the spool to auth, in order, deleting
// each once auth has it. It starts with whatever the spool holds, so
// chunks left by a crash or restart are shipped first.
type Uploader struct {
	cfg    UploaderConfig
	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// mu serialises scans (Run's loop only; Flush in tests) and guards
	// what follows.
	mu sync.Mutex
	// cursors: how far each session's segments are shipped.
	cursors map[string]*segmentReader
}

// NewUploader starts the upload loop; Close stops it.
func NewUploader(cfg UploaderConfig) (*Uploader, error) {
	if cfg.Spool.Dir == "" {
		return nil, trace.BadParameter("recording uploader: missing Spool")
	}
	if cfg.Upload == nil {
		return nil, trace.BadParameter("recording uploader: missing Upload")
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.WithField("component", "recording:upload")
	}
	if err := os.MkdirAll(cfg.Spool.Dir, 0o700); err != nil {
		return nil, trace.ConvertSystemError(err)
	}
	u := &Uploader{cfg: cfg, kick: make(chan struct{}, 1), done: make(chan struct{}),
		cursors: map[string]*segmentReader{}}
	u.ctx, u.cancel = context.WithCancel(context.Background())
	go u.run()
	return u, nil
}

// Notify asks for a scan (a chunk was closed).
func (u *Uploader) Notify() {
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// Close stops the loop and waits for it; unshipped chunks stay spooled.
func (u *Uploader) Close() error {
	u.cancel()
	<-u.done
	return nil
}

func (u *Uploader) run() {
	defer close(u.done)
	ticker := u.cfg.Clock.NewTicker(u.cfg.RetryInterval)
	defer ticker.Stop()
	for {
		if err := u.Flush(u.ctx); err != nil && u.ctx.Err() == nil {
			u.cfg.Logger.WithError(err).Warn("Uploading recordings failed; will retry.")
		}
		select {
		case <-u.ctx.Done():
			return
		case <-u.kick:
		case <-ticker.Chan():
		}
	}
}

// Flush ships everything spooled now; the first error stops it (order
// matters: auth refuses a chunk whose predecessor it lacks).
func (u *Uploader) Flush(ctx context.Context) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	ents, err := os.ReadDir(u.cfg.Spool.Dir)
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	for _, e := range ents {
		if !e.IsDir() || CheckSessionID(e.Name()) != nil {
			continue
		}
		if err := u.flushSession(ctx, e.Name()); err != nil {
			return trace.Wrap(err)
		}
	}
	return nil
}

// flushSession ships a session's chunks in order: chunk files (an older
// node's spool) are deleted one by one once auth has them; segments are
// read on from where the last scan stopped and deleted once auth has all
// of them and the writer has moved on to a later segment (or the final
// chunk is shipped, which removes the session). A session whose writer
// is gone (spool.go, lockName) is removed once all of it is shipped.
func (u *Uploader) flushSession(ctx context.Context, session string) error {
	// Whether the writer is gone is asked before the files are listed:
	// a writer that appends its final chunk and releases its lock while
	// this scan ships the earlier ones has left a chunk this scan never
	// read, and asked afterwards "gone" would remove it unshipped. Gone
	// before the listing, everything it wrote is in the files listed.
	lock, gone := u.cfg.Spool.writerGone(session)
	if gone {
		defer lock.Close()
	}
	chunks, segs, err := u.cfg.Spool.sessionFiles(session)
	if trace.IsNotFound(err) {
		delete(u.cursors, session)
		return nil
	}
	if err != nil {
		return trace.Wrap(err)
	}
	done := func() {
		// Nothing follows a final chunk: the session is done here.
		_ = os.RemoveAll(filepath.Join(u.cfg.Spool.Dir, session))
		delete(u.cursors, session)
	}
	for _, i := range chunks {
		c, err := u.cfg.Spool.GetChunk(ctx, session, i)
		if err != nil {
			return trace.Wrap(err)
		}
		if err := u.cfg.Upload.PutRecordingChunk(ctx, session, *c); err != nil {
			return trace.Wrap(err, "uploading chunk %d of %s", i, session)
		}
		if err := u.cfg.Spool.RemoveChunk(session, i); err != nil {
			return trace.Wrap(err)
		}
		if c.Final {
			done()
			return nil
		}
	}
	cur := u.cursors[session]
	for k, first := range segs {
		if cur != nil && first < cur.first {
			// Shipped already; its removal failed last time.
			_ = os.Remove(filepath.Join(u.cfg.Spool.Dir, session, segmentName(first)))
			continue
		}
		if cur == nil || first > cur.first {
			cur = &segmentReader{first: first}
			u.cursors[session] = cur
		}
		data, err := u.cfg.Spool.readSegmentFrom(session, first, cur.off)
		if err != nil {
			return trace.Wrap(err)
		}
		final := false
		n, err := wholeLines(data, func(line []byte) error {
			var c Chunk
			if err := json.Unmarshal(line, &c); err != nil {
				return trace.BadParameter("spooled segment %s of %s is unreadable at byte %d: %v", segmentName(first), session, cur.off, err)
			}
			if err := u.cfg.Upload.PutRecordingChunk(ctx, session, c); err != nil {
				return trace.Wrap(err, "uploading chunk %d of %s", c.Index, session)
			}
			cur.off += int64(len(line)) + 1
			final = final || c.Final
			return nil
		})
		if err != nil {
			return trace.Wrap(err)
		}
		if final {
			done()
			return nil
		}
		if k < len(segs)-1 {
			// The writer has moved on: nothing more comes to this one
			// (a torn tail can only be the last segment's).
			if n < len(data) {
				u.cfg.Logger.WithField("session_id", session).Warnf("Spooled segment %s ends in a torn chunk; skipped.", segmentName(first))
			}
			if err := os.Remove(filepath.Join(u.cfg.Spool.Dir, session, segmentName(first))); err != nil {
				return trace.ConvertSystemError(err)
			}
		}
	}
	if gone {
		// A dead writer's session (a killed node's, found after its
		// restart): all it spooled is shipped, and nothing more will come
		// (the recording stays incomplete).
		done()
	}
	return nil
}
