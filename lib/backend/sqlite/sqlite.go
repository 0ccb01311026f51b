// Package sqlite is Postern's default Backend: one SQLite file (pure-Go
// driver modernc.org/sqlite, no cgo) owned by the auth server.
//
// Durability: the file runs in WAL mode with synchronous=FULL, so a write
// that returned is on disk and survives SIGKILL or power loss; the crash test
// kills a writer mid-stream and checks every acknowledged key.
//
// Watch: only one process ever opens the file (the auth server; everyone
// else goes through its API), so there is no event log table. Writes are
// serialized by a Go mutex on a single writer connection, and after each
// commit the events are fanned out in-process to the watchers before the
// mutex is released, which gives commit order for free. A second process
// writing the same file would not be seen by this one's watchers: don't.
//
// Expiry: an expired row is invisible to reads at once (every query filters
// on expires); a sweeper deletes expired rows and emits their delete events,
// woken by a clock timer at the earliest expiry (tracked in-process, since
// this process is the only writer) and, as a backstop, every SweepInterval.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"modernc.org/sqlite" // registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/postern-dev/postern/lib/backend"
)

// DefaultSweepInterval bounds how late an expired row can be swept if the
// expiry timer is wrong, which only happens when the wall clock jumps
// (timers run on monotonic time, expiry is wall time). Reads never return
// expired rows regardless, so lateness only delays delete events.
const DefaultSweepInterval = 30 * time.Second

// busyTimeout is how long SQLite waits on a lock held by another connection
// (the readers and the checkpointer) before failing with SQLITE_BUSY. Writes
// are serialized in-process, so contention is short; 10s only matters if the
// disk stalls, in which case failing is better than hanging forever.
const busyTimeout = 10 * time.Second

// maxReaders is the size of the read connection pool. WAL lets readers run
// beside the writer; a handful is plenty on the small machines we target.
const maxReaders = 4

// Config configures the SQLite backend.
type Config struct {
	// Path is the database file; required. Its directory is created (0700)
	// when missing.
	Path string
	// Clock drives expiry; nil means the real clock.
	Clock clockwork.Clock
	// Logger; nil means logrus with component=backend.sqlite.
	Logger logrus.FieldLogger
	// SweepInterval is the backstop sweep period (see DefaultSweepInterval);
	// zero means the default.
	SweepInterval time.Duration
}

// CheckAndSetDefaults validates the config and fills in defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.Path == "" {
		return trace.BadParameter("sqlite backend: missing Path")
	}
	if strings.ContainsRune(c.Path, '?') {
		// The driver would read the rest as connection parameters.
		return trace.BadParameter("sqlite backend: path %q must not contain '?'", c.Path)
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = logrus.WithField("component", "backend.sqlite")
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	return nil
}

// Backend is the SQLite Backend.
type Backend struct {
	cfg    Config
	writer *sql.DB // one connection: every write goes through mu anyway
	reader *sql.DB // query-only pool
	fanout *backend.Fanout

	// mu serializes writes (commit, then fan-out, in that order, so watchers
	// see commit order) and guards the fields below. Lock order: mu, then
	// the Fanout's.
	mu sync.Mutex
	// rev is the last revision handed out; persisted in the meta table in
	// the same transaction as each write.
	rev int64
	// nextWake is when the expiry timer is armed for; zero when disarmed.
	nextWake time.Time
	timer    clockwork.Timer
	closed   bool
	// readClosed mirrors closed for readers, which must not wait on mu
	// (a writer holds it across an fsync).
	readClosed atomic.Bool

	closeCh chan struct{}
	wg      sync.WaitGroup

	// Statements of the write path, prepared once on the writer's one
	// connection: preparing them per write was ~12% of a proxy's CPU per
	// SSH setup (each setup writes its audit events).
	upsertStmt, bumpStmt, existsStmt *sql.Stmt
}

var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.BatchCreator = (*Backend)(nil)
)

const schema = `
CREATE TABLE IF NOT EXISTS kv (
	key TEXT PRIMARY KEY,
	value BLOB NOT NULL,
	expires INTEGER NOT NULL DEFAULT 0, -- unix nanoseconds; 0 = never
	revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_expires ON kv(expires) WHERE expires != 0;
CREATE TABLE IF NOT EXISTS meta (
	name TEXT PRIMARY KEY,
	value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO meta(name, value) VALUES ('revision', 0);
`

// New opens (creating if needed) the database at cfg.Path. Close it to stop
// its sweeper and release the file.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	path, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cfg.Path = path
	if err := checkDir(filepath.Dir(path)); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := createFile(path); err != nil {
		return nil, trace.Wrap(err)
	}
	params := "?_busy_timeout=" + strconv.FormatInt(busyTimeout.Milliseconds(), 10) + "&_synchronous=FULL"
	writer, err := sql.Open("sqlite", path+params+"&_journal_mode=WAL&_txlock=immediate")
	if err != nil {
		return nil, trace.Wrap(err, "opening SQLite database %q", path)
	}
	writer.SetMaxOpenConns(1)
	writer.SetConnMaxIdleTime(0)
	b := &Backend{
		cfg:     cfg,
		writer:  writer,
		fanout:  backend.NewFanout(),
		closeCh: make(chan struct{}),
	}
	if err := b.init(ctx); err != nil {
		writer.Close()
		return nil, trace.Wrap(err)
	}
	b.reader, err = sql.Open("sqlite", path+params+"&_query_only=1")
	if err != nil {
		writer.Close()
		return nil, trace.Wrap(err, "opening SQLite database %q", path)
	}
	b.reader.SetMaxOpenConns(maxReaders)
	b.reader.SetMaxIdleConns(maxReaders)

	b.timer = cfg.Clock.NewTimer(time.Hour)
	b.timer.Stop()
	b.mu.Lock()
	err = b.scheduleLocked(ctx)
	b.mu.Unlock()
	if err != nil {
		b.reader.Close()
		b.writer.Close()
		return nil, trace.Wrap(err)
	}
	ticker := cfg.Clock.NewTicker(cfg.SweepInterval)
	b.wg.Add(1)
	go b.sweepLoop(ticker)
	cfg.Logger.WithField("path", path).Debug("Opened SQLite backend.")
	return b, nil
}

// checkDir creates dir if needed and proves it is writable, so that a bad
// data directory fails with its name instead of SQLite's bare "unable to
// open database file".
func checkDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return trace.ConvertSystemError(trace.Wrap(err, "sqlite backend: cannot create directory %q", dir))
	}
	f, err := os.CreateTemp(dir, ".postern-write-probe-*")
	if err != nil {
		return trace.ConvertSystemError(trace.Wrap(err, "sqlite backend: directory %q is not writable", dir))
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return nil
}

// createFile creates the database file readable by its owner only, before
// SQLite would create it with the umask's 0644: it holds the certificate
// authorities' private keys. SQLite gives the -wal and -shm files the same
// mode as the database.
func createFile(path string) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.IsDir():
		return trace.BadParameter("sqlite backend: %q is a directory, not a database file", path)
	case err == nil:
		return nil
	case !os.IsNotExist(err):
		return trace.ConvertSystemError(trace.Wrap(err, "sqlite backend: %q", path))
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil && !os.IsExist(err) {
		return trace.ConvertSystemError(trace.Wrap(err, "sqlite backend: creating %q", path))
	}
	if f != nil {
		f.Close()
	}
	return nil
}

// init applies the schema and loads the revision counter. It is the first
// statement on the file, so it is where a file that is not a database is
// detected.
func (b *Backend) init(ctx context.Context) error {
	var mode string
	if err := b.writer.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return b.openError(err)
	}
	if !strings.EqualFold(mode, "wal") {
		return trace.BadParameter("sqlite backend: %q: journal mode is %q, want wal", b.cfg.Path, mode)
	}
	if _, err := b.writer.ExecContext(ctx, schema); err != nil {
		return b.openError(err)
	}
	if err := b.writer.QueryRowContext(ctx, "SELECT value FROM meta WHERE name = 'revision'").Scan(&b.rev); err != nil {
		return b.openError(err)
	}
	for _, st := range []struct {
		stmt  **sql.Stmt
		query string
	}{
		{&b.upsertStmt, upsertQuery},
		{&b.bumpStmt, bumpQuery},
		{&b.existsStmt, existsQuery},
	} {
		stmt, err := b.writer.PrepareContext(ctx, st.query)
		if err != nil {
			return b.openError(err)
		}
		*st.stmt = stmt
	}
	return nil
}

func (b *Backend) openError(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "file is not a database"), strings.Contains(msg, "malformed"):
		return trace.BadParameter("sqlite backend: %q is not a valid SQLite database: %v", b.cfg.Path, err)
	case strings.Contains(msg, "readonly"), strings.Contains(msg, "unable to open"):
		return trace.AccessDenied("sqlite backend: cannot write %q: %v", b.cfg.Path, err)
	}
	return trace.Wrap(err, "sqlite backend: opening %q", b.cfg.Path)
}

// Clock implements Backend.
func (b *Backend) Clock() clockwork.Clock { return b.cfg.Clock }

// Path returns the absolute path of the database file.
func (b *Backend) Path() string { return b.cfg.Path }

// Close stops the sweeper, closes every watcher and the database.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.readClosed.Store(true)
	b.timer.Stop()
	close(b.closeCh)
	b.mu.Unlock()
	b.wg.Wait()
	b.fanout.Close()
	return trace.NewAggregate(b.reader.Close(), b.writer.Close())
}

func (b *Backend) sweepLoop(ticker clockwork.Ticker) {
	defer b.wg.Done()
	defer ticker.Stop()
	for {
		select {
		case <-b.closeCh:
			return
		case <-b.timer.Chan():
		case <-ticker.Chan():
		}
		if err := b.sweep(); err != nil {
			b.cfg.Logger.WithError(err).Warn("Failed to sweep expired items.")
		}
	}
}

// sweep deletes every expired row in one transaction, emits their delete
// events and re-arms the timer.
func (b *Backend) sweep() error {
	ctx := context.Background()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	now := b.cfg.Clock.Now().UnixNano()
	var events []backend.Event
	err := b.txLocked(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx,
			"DELETE FROM kv WHERE expires != 0 AND expires <= ? RETURNING key", now)
		if err != nil {
			return trace.Wrap(err)
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			if err := rows.Scan(&key); err != nil {
				return trace.Wrap(err)
			}
			events = append(events, backend.Event{Type: backend.OpDelete, Item: backend.Item{Key: key}})
		}
		return trace.Wrap(rows.Err())
	})
	if err != nil {
		return trace.Wrap(err)
	}
	// RETURNING order is unspecified; sorting makes the events of one sweep
	// deterministic, which tests and humans reading logs both like.
	sortEvents(events)
	b.fanout.Emit(events...)
	b.nextWake = time.Time{}
	return trace.Wrap(b.scheduleLocked(ctx))
}

// scheduleLocked arms the timer for the earliest expiry in the table.
func (b *Backend) scheduleLocked(ctx context.Context) error {
	var next sql.NullInt64
	err := b.writer.QueryRowContext(ctx, "SELECT MIN(expires) FROM kv WHERE expires != 0").Scan(&next)
	if err != nil {
		return b.openError(err)
	}
	if next.Valid {
		b.armLocked(time.Unix(0, next.Int64))
	}
	return nil
}

// armLocked makes sure the timer fires no later than at.
func (b *Backend) armLocked(at time.Time) {
	if b.closed || (!b.nextWake.IsZero() && !at.Before(b.nextWake)) {
		return
	}
	b.nextWake = at
	b.timer.Reset(b.cfg.Clock.Until(at))
}

// txLocked runs fn in a write transaction and maps driver errors.
func (b *Backend) txLocked(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := b.writer.BeginTx(ctx, nil)
	if err != nil {
		return convertError(err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return convertError(err)
	}
	return convertError(tx.Commit())
}

// convertError keeps trace classifications and maps a closed database,
// and SQLite's errors that mean the store itself cannot be used (an I/O
// error, a full disk, a file that cannot be opened or is locked, corrupt
// or not a database), to ConnectionProblem: the backend contract's "the
// store cannot be reached", which every caller up to the user reports as
// "unavailable, try again later" rather than as an internal error. Other
// driver errors (a bad query: our bug) are wrapped as they are.
func convertError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrConnDone) || strings.Contains(err.Error(), "database is closed") {
		return trace.ConnectionProblem(err, "sqlite backend is closed")
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff { // the primary result code
		case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN,
			sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_READONLY,
			sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_PERM,
			sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_NOMEM:
			return trace.ConnectionProblem(err, "sqlite backend is unavailable: %v", se)
		}
	}
	return trace.Wrap(err)
}
