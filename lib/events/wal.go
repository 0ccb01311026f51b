package events

// The file is the write-ahead log of the backend and of shipping.
//
// The backend (where the auth role runs) and the auth server (where it
// does not) can be unreachable for minutes: an etcd election, a lost
// quorum, auth restarting. Events held in memory for them meanwhile are
// lost when the process dies, and a bounded memory queue must drop once
// full. The file in the data dir has every event already (it is written
// first, and it is local), so, with a Dir, the backend and remote sinks
// do not keep events of their own: each follows events.log, reading the
// lines past its cursor, the byte offset up to which its destination has
// taken every event, and saves that cursor next to the file
// (events.log.backend.cursor, events.log.remote.cursor) after each batch
// it stored. Then:
//
//   - a batch that fails is retried with backoff until it is stored; the
//     events behind it wait in the file, not in memory, so an outage of
//     any length costs disk, never events, and never blocks Emit;
//   - after a crash (SIGKILL during an etcd outage), the next start reads
//     from the saved cursor and stores what the last run did not;
//   - an event is never doubled by a replay: a retry or a replay of a
//     batch partly stored before carries the same ids, and the backend's
//     CreateMany skips a key that exists (auth derives a shipped event's
//     id from the host and the host's own id, ShippedEvent), so replaying
//     too much is safe where replaying too little would lose events. The
//     cursor is saved without fsync for that reason: one that lags after
//     a power loss costs a few rewrites.
//
// The cursor is checked before it is trusted: one naming another file (a
// rotation replaced events.log: its inode differs), an offset past the
// end (the file was truncated, e.g. logrotate copytruncate) or not at the
// start of a line makes the follower start over at the beginning of the
// current file, which only rewrites what is there already. Without a
// cursor file (the first start of this version, a new data dir) it starts
// at the current end: the file's older events were the previous version's
// to store, and the cursor is saved at once, so a crash right after
// start-up still finds it.
//
// The follower reads from the open file (the one the file sink appends
// to), so a rotation by rename while running is harmless. Reading back
// what was just written costs a page-cache read per batch; the backend
// write dwarfs it.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backoff"
)

// follower is the state of a sink that follows the file.
type follower struct {
	// offset is where the next batch is read from: everything before it
	// is stored. Touched by the follower's goroutine only (and before it
	// starts).
	offset int64
	// fileID is the file's inode, saved with the cursor.
	fileID uint64
	// cursorPath is where offset is saved.
	cursorPath string
	// wake is signalled (without blocking) after each file write.
	wake chan struct{}
	// done is closed when the follower stops.
	done chan struct{}

	// progMu guards acked, restarts and progress: acked is offset as of
	// the last stored batch, restarts counts starts over (the file
	// shrank), progress is closed and replaced at every change.
	progMu   sync.Mutex
	acked    int64
	restarts int
	progress chan struct{}
}

// CursorSuffix ends the names of the cursor files beside events.log:
// events.log.backend.cursor and events.log.remote.cursor.
const CursorSuffix = ".cursor"

func cursorPath(dir, sink string) string {
	return filepath.Join(dir, FileName+"."+sink+CursorSuffix)
}

// openCursor reads (or creates) s's cursor, checks it against the file,
// and counts the events past it.
func (s *sink) openCursor() error {
	l := s.l
	s.wake = make(chan struct{}, 1)
	s.done = make(chan struct{})
	s.progress = make(chan struct{})
	s.cursorPath = cursorPath(l.cfg.Dir, s.name)
	fi, err := l.file.Stat()
	if err != nil {
		return trace.ConvertSystemError(err)
	}
	size := fi.Size()
	s.fileID = fileID(fi)
	log := l.log.WithFields(logrus.Fields{"sink": s.name, "cursor": s.cursorPath})
	offset, id, err := readCursor(s.cursorPath)
	switch {
	case trace.IsNotFound(err):
		// See the top of this file: the older events were not ours.
		s.offset = size
		if err := writeCursor(s.cursorPath, size, s.fileID); err != nil {
			return trace.Wrap(err)
		}
	case err != nil:
		log.WithError(err).Warn("Unreadable audit cursor; storing the whole audit log file again (events already stored are skipped).")
	case id != 0 && s.fileID != 0 && id != s.fileID:
		log.Warn("The audit log file was replaced (rotated?) since the cursor was saved; storing the new file from its start. Events the previous file held past the cursor are not replayed.")
	case offset > size:
		log.WithFields(logrus.Fields{"offset": offset, "size": size}).
			Warn("The audit log file is shorter than the cursor (truncated?); storing it from its start.")
	case offset > 0 && !l.lineStart(offset):
		log.WithField("offset", offset).Warn("The audit cursor is not at the start of a line; storing the audit log file from its start.")
	default:
		s.offset = offset
	}
	s.acked = s.offset
	n, err := l.countLines(s.offset, size)
	if err != nil {
		return trace.Wrap(err)
	}
	s.ahead.Store(n)
	if n > 0 {
		log.WithField("events", n).Info("Replaying audit events the last run did not store.")
	}
	return nil
}

// readCursor reads "OFFSET FILEID" from path; NotFound when it is missing.
func readCursor(path string) (offset int64, id uint64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, trace.ConvertSystemError(err)
	}
	f := strings.Fields(string(data))
	if len(f) != 2 {
		return 0, 0, trace.BadParameter("malformed audit cursor %q", data)
	}
	offset, err = strconv.ParseInt(f[0], 10, 64)
	if err != nil || offset < 0 {
		return 0, 0, trace.BadParameter("malformed audit cursor offset %q", f[0])
	}
	id, err = strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0, 0, trace.BadParameter("malformed audit cursor file id %q", f[1])
	}
	return offset, id, nil
}

// writeCursor replaces path (write and rename: a reader never sees half a
// cursor).
func writeCursor(path string, offset int64, id uint64) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d %d\n", offset, id)), 0o600); err != nil {
		return trace.ConvertSystemError(err)
	}
	return trace.ConvertSystemError(os.Rename(tmp, path))
}

// lineStart says whether offset starts a line of the file.
func (l *Log) lineStart(offset int64) bool {
	b := make([]byte, 1)
	_, err := l.file.ReadAt(b, offset-1)
	return err == nil && b[0] == '\n'
}

// countLines counts the lines in [from, to) of the file.
func (l *Log) countLines(from, to int64) (int64, error) {
	var n int64
	buf := make([]byte, 64<<10)
	for from < to {
		chunk := buf[:min(int64(len(buf)), to-from)]
		k, err := l.file.ReadAt(chunk, from)
		n += int64(bytes.Count(chunk[:k], []byte{'\n'}))
		from += int64(k)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return 0, trace.ConvertSystemError(err)
		}
	}
	return n, nil
}

// fileWritten tells the followers the file grew by lines lines.
func (l *Log) fileWritten(lines int64) {
	// With O_APPEND, the file offset after a write is the end of the
	// file, wherever an external truncation left it.
	end, err := l.file.Seek(0, io.SeekCurrent)
	if err != nil {
		return
	}
	for _, s := range l.followers {
		// Before fileEnd moves: a follower never acknowledges lines it
		// was not yet counted for.
		s.ahead.Add(lines)
	}
	l.fileEnd.Store(end)
	for _, s := range l.followers {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// follow stores what is in the file past the cursor, then what the file
// sink writes, until the file sink is done and everything is stored, or
// Close's grace runs out.
func (s *sink) follow() {
	for {
		if !s.catchUp() {
			return
		}
		select {
		case <-s.wake:
		case <-s.l.fileDone:
			s.catchUp()
			return
		case <-s.l.ctx.Done():
			return
		}
	}
}

// catchUp stores batches until the cursor is at the end of the file;
// false when Close's grace ran out.
func (s *sink) catchUp() bool {
	b := backoff.Backoff{Min: s.l.cfg.RetryMin, Max: s.l.cfg.RetryMax}
	for {
		if s.l.ctx.Err() != nil {
			return false
		}
		end := s.l.fileEnd.Load()
		if fi, err := s.l.file.Stat(); err == nil && fi.Size() < end {
			end = fi.Size()
		}
		if s.offset > end {
			s.restart(end)
			continue
		}
		if s.offset == end {
			return true
		}
		batch, next, lines, err := s.readBatch(end)
		if err != nil {
			s.l.log.WithError(err).WithField("sink", s.name).Warn("Cannot read the audit log file; will keep trying.")
			if !s.sleep(&b) {
				return false
			}
			continue
		}
		if next == s.offset {
			// No whole line yet (an external writer's half line):
			// wait for the next write.
			return true
		}
		if len(batch) > 0 && !s.deliverWithRetry(batch) {
			return false
		}
		s.advance(next, lines)
		b.Reset()
	}
}

// restart starts over at the beginning of a file that shrank.
func (s *sink) restart(end int64) {
	s.l.log.WithField("sink", s.name).Warn("The audit log file shrank (truncated?); storing it from its start.")
	s.offset = 0
	n, _ := s.l.countLines(0, end)
	s.ahead.Store(n)
	s.progMu.Lock()
	s.acked = 0
	s.restarts++
	close(s.progress)
	s.progress = make(chan struct{})
	s.progMu.Unlock()
	s.l.updatePending()
}

// readBatch reads up to BatchSize whole lines (and about maxBatchBytes)
// from the cursor: the events to store, where the next batch starts, and
// how many lines it covered (lines that are not an event, such as the end
// of a line a crash cut, are skipped and counted as dropped).
func (s *sink) readBatch(end int64) (batch []record, next int64, lines int64, err error) {
	size := min(end-s.offset, maxBatchBytes)
	var buf []byte
	for {
		buf = make([]byte, size)
		n, err := s.l.file.ReadAt(buf, s.offset)
		if err != nil && !(errors.Is(err, io.EOF) && n == len(buf)) {
			return nil, 0, 0, trace.ConvertSystemError(err)
		}
		if bytes.IndexByte(buf, '\n') >= 0 || size == end-s.offset {
			break
		}
		// One line longer than maxBatchBytes: read more.
		size = min(size*2, end-s.offset)
	}
	next = s.offset
	for len(batch) < s.l.cfg.BatchSize {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		line := buf[:i]
		buf = buf[i+1:]
		next += int64(i + 1)
		lines++
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(line, &e); err != nil || e.Type == "" || e.ID == "" ||
			backend.CheckKey(eventKey(e)) != nil {
			s.l.metrics.dropped.WithLabelValues(s.name).Inc()
			s.l.log.WithField("sink", s.name).WithField("offset", next-int64(i+1)).
				Warn("Skipping a line of the audit log file that is not an event this log wrote.")
			continue
		}
		batch = append(batch, record{event: e, line: line})
	}
	return batch, next, lines, nil
}

// advance moves the cursor past a stored batch and saves it.
func (s *sink) advance(next, lines int64) {
	s.offset = next
	s.ahead.Add(-lines)
	if err := writeCursor(s.cursorPath, next, s.fileID); err != nil {
		s.l.log.WithError(err).WithField("sink", s.name).
			Warn("Cannot save the audit cursor; a restart would store some events again.")
	}
	s.progMu.Lock()
	s.acked = next
	close(s.progress)
	s.progress = make(chan struct{})
	s.progMu.Unlock()
	s.l.updatePending()
}

// waitAcked waits until the cursor reaches target (or the follower starts
// over or stops).
func (s *sink) waitAcked(ctx context.Context, target int64) error {
	s.progMu.Lock()
	restarts := s.restarts
	s.progMu.Unlock()
	for {
		s.progMu.Lock()
		if s.acked >= target || s.restarts != restarts {
			s.progMu.Unlock()
			return nil
		}
		ch := s.progress
		s.progMu.Unlock()
		select {
		case <-ch:
		case <-s.done:
			return nil
		case <-ctx.Done():
			return trace.Wrap(ctx.Err())
		}
	}
}
