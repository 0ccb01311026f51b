package export

// The file exporter: JSON lines appended to audit.file, for a log shipper
// (Filebeat, Vector, Fluent Bit) to tail.
//
// Rotation: logrotate's default ("create") renames the file and expects
// the writer to start a new one. The exporter notices before every batch,
// by comparing the inode at the path with the open file's (a stat per
// batch), and reopens; SIGHUP (logrotate's usual postrotate) reopens at
// once, so that the new file exists before the next event. A rotation by
// copytruncate needs nothing: the file is opened O_APPEND.
//
// Rotation by size (audit.max_size_bytes), for hosts without logrotate:
// once a batch leaves the file at or past the size, FILE.N-1 becomes
// FILE.N (the oldest, FILE.MaxFiles, is removed), FILE becomes FILE.1 and
// a new FILE is opened. A batch is never split, so a file may pass the
// size by one batch (at most maxBatchBytes).
//
// fsync: each batch is one write followed by one fsync, so that what a
// shipper has read survives a power loss as well. A batch is whatever
// queued during the previous write and fsync, so under load the cost is
// one fsync per batch, not per event.

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/gravitational/trace"
)

// File appends events to a file. Safe for concurrent use.
type File struct {
	*queue
	path string
	// maxSize and maxFiles: rotation by size (0: none).
	maxSize  int64
	maxFiles int
	f        *os.File // the goroutine's only
	// failing is true from a write error to the next success: one log
	// line per streak. The goroutine's only.
	failing bool
	hup     chan os.Signal
	// onReopen, in tests, is called after each reopen.
	onReopen func()
}

// NewFile opens (creates, 0600) cfg.File for appending and starts its
// writer.
func NewFile(cfg Config) (*File, error) {
	x, err := newFile(cfg)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	x.start()
	return x, nil
}

func newFile(cfg Config) (*File, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	path, err := filepath.Abs(cfg.File)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	x := &File{path: path, hup: make(chan os.Signal, 1), maxSize: cfg.MaxSizeBytes, maxFiles: cfg.MaxFiles}
	if x.queue, err = newQueue(&cfg, SinkFile, x.write); err != nil {
		return nil, trace.Wrap(err)
	}
	if x.f, err = openAppend(path); err != nil {
		return nil, trace.BadParameter("audit.file: %v", err)
	}
	return x, nil
}

// start watches SIGHUP and starts the writer.
func (x *File) start() {
	signal.Notify(x.hup, syscall.SIGHUP)
	go x.watchHangup()
	x.queue.start()
}

// openAppend opens path for appending, creating it 0600 (audit records
// name users, addresses and commands).
func openAppend(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	return f, trace.ConvertSystemError(err)
}

// watchHangup turns SIGHUP into a reopen, done by the writer (which owns
// the file) after what is queued. When the queue is full the signal is
// not queued: the writer reopens anyway before its next batch if the
// file was renamed.
func (x *File) watchHangup() {
	for {
		select {
		case <-x.hup:
			x.mu.RLock()
			if !x.closed {
				select {
				case x.ch <- item{then: x.hangup}:
				default:
				}
			}
			x.mu.RUnlock()
		case <-x.done:
			return
		}
	}
}

// hangup reopens the file after SIGHUP.
func (x *File) hangup() {
	if err := x.reopen("SIGHUP"); err != nil {
		x.fail(err)
	}
}

// write appends one batch, reopening first when the file was rotated.
func (x *File) write(_ context.Context, batch [][]byte) int {
	if x.rotated() {
		if err := x.reopen("the file was renamed or removed"); err != nil {
			// Writing on to the old file would lose the events
			// unseen: count them instead.
			x.fail(err)
			return len(batch)
		}
	}
	if _, err := x.f.Write(joinLines(batch)); err != nil {
		x.fail(trace.ConvertSystemError(err))
		return len(batch)
	}
	if err := x.f.Sync(); err != nil {
		x.fail(trace.ConvertSystemError(err))
		return 0 // written, maybe not on disk: not dropped
	}
	if x.failing {
		x.failing = false
		x.log.Info("Audit events are being exported to the file again.")
	}
	if x.maxSize > 0 {
		if st, err := x.f.Stat(); err == nil && st.Size() >= x.maxSize {
			if err := x.rotate(); err != nil {
				x.fail(err)
			}
		}
	}
	return 0
}

// rotate shifts FILE.N-1 to FILE.N down to FILE to FILE.1, then opens a
// new FILE. A failure leaves the open file open (events go on there).
func (x *File) rotate() error {
	name := func(i int) string { return x.path + "." + strconv.Itoa(i) }
	if err := os.Remove(name(x.maxFiles)); err != nil && !os.IsNotExist(err) {
		return trace.ConvertSystemError(err)
	}
	for i := x.maxFiles - 1; i >= 1; i-- {
		if err := os.Rename(name(i), name(i+1)); err != nil && !os.IsNotExist(err) {
			return trace.ConvertSystemError(err)
		}
	}
	if err := os.Rename(x.path, name(1)); err != nil {
		return trace.ConvertSystemError(err)
	}
	return trace.Wrap(x.reopen("it reached audit.max_size_bytes"))
}

func (x *File) fail(err error) {
	if !x.failing {
		x.failing = true
		x.log.WithError(err).WithField("path", x.path).Error("Cannot write the audit export file; dropping events until it can be written.")
	}
}

// rotated says whether the path no longer names the open file.
func (x *File) rotated() bool {
	open, err := x.f.Stat()
	if err != nil {
		return true
	}
	cur, err := os.Stat(x.path)
	if err != nil {
		return true
	}
	return !os.SameFile(open, cur)
}

// reopen closes the open file and opens the path again; on failure the
// open file stays open.
func (x *File) reopen(why string) error {
	f, err := openAppend(x.path)
	if err != nil {
		return trace.Wrap(err)
	}
	x.f.Close()
	x.f = f
	x.log.WithField("path", x.path).WithField("why", why).Info("Reopened the audit export file.")
	if x.onReopen != nil {
		x.onReopen()
	}
	return nil
}

// Close flushes (within ctx), stops watching SIGHUP and closes the file.
func (x *File) Close(ctx context.Context) error {
	err := x.queue.Close(ctx)
	signal.Stop(x.hup)
	if cerr := x.f.Close(); err == nil {
		err = trace.ConvertSystemError(cerr)
	}
	return trace.Wrap(err)
}
