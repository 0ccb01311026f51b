package sqlite

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/test"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		crashWriter()
		return
	}
	goleak.VerifyTestMain(m)
}

func newBackend(t testing.TB, clock clockwork.Clock) *Backend {
	b, err := New(context.Background(), Config{
		Path:   filepath.Join(t.TempDir(), "postern.db"),
		Clock:  clock,
		Logger: logrus.WithField("test", t.Name()),
	})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func TestSQLite(t *testing.T) {
	test.RunBackendComplianceSuite(t, func(t *testing.T) (backend.Backend, *clockwork.FakeClock) {
		clock := clockwork.NewFakeClock()
		return newBackend(t, clock), clock
	})
}

// TestReopen checks that data, expiry and revisions survive a restart, and
// that an item which expired while the backend was down is swept (with a
// delete event) once it is back.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	path := filepath.Join(t.TempDir(), "sub", "dir", "postern.db")
	b, err := New(ctx, Config{Path: path, Clock: clock})
	require.NoError(t, err)
	first, err := b.Put(ctx, backend.Item{Key: "/a", Value: []byte("1")})
	require.NoError(t, err)
	_, err = b.Put(ctx, backend.Item{Key: "/ttl", Value: []byte("2"), Expires: clock.Now().Add(time.Minute)})
	require.NoError(t, err)
	// The file holds private keys: owner-only, WAL included.
	for _, name := range []string{path, path + "-wal", path + "-shm"} {
		st, err := os.Stat(name)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), name)
	}
	require.NoError(t, b.Close())

	b, err = New(ctx, Config{Path: path, Clock: clock})
	require.NoError(t, err)
	defer b.Close()
	got, err := b.Get(ctx, "/a")
	require.NoError(t, err)
	require.Equal(t, []byte("1"), got.Value)
	require.Equal(t, first.Revision, got.Revision)
	next, err := b.Put(ctx, backend.Item{Key: "/b", Value: []byte("3")})
	require.NoError(t, err)
	require.Greater(t, next.Revision, first.Revision, "revisions must not be reused after a restart")

	w, err := b.NewWatcher(ctx, backend.Watch{Name: "reopen"})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)
	clock.Advance(time.Minute)
	select {
	case ev := <-w.Events():
		require.Equal(t, backend.OpDelete, ev.Type)
		require.Equal(t, "/ttl", ev.Item.Key)
	case <-time.After(test.EventTimeout):
		t.Fatal("no delete event for an item stored before the restart")
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	_, err := New(ctx, Config{})
	require.True(t, trace.IsBadParameter(err), "%v", err)

	// The parent "directory" is a regular file: cannot be created or written.
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	_, err = New(ctx, Config{Path: filepath.Join(file, "postern.db")})
	require.Error(t, err)
	require.Contains(t, err.Error(), file)

	// A file that is not a database.
	junk := filepath.Join(dir, "junk.db")
	require.NoError(t, os.WriteFile(junk, []byte(strings.Repeat("this is not sqlite ", 400)), 0o600))
	_, err = New(ctx, Config{Path: junk})
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), junk)
	require.Contains(t, err.Error(), "not a valid SQLite database")

	// A directory where the file should be.
	_, err = New(ctx, Config{Path: dir})
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), dir)

	// A read-only directory (only meaningful when not root: root ignores
	// permission bits).
	if os.Geteuid() != 0 {
		ro := filepath.Join(dir, "ro")
		require.NoError(t, os.Mkdir(ro, 0o500))
		_, err = New(ctx, Config{Path: filepath.Join(ro, "postern.db")})
		require.Error(t, err)
		require.Contains(t, err.Error(), ro)
	}
}

func TestClosed(t *testing.T) {
	b := newBackend(t, nil)
	require.NoError(t, b.Close())
	_, err := b.Get(context.Background(), "/x")
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	_, err = b.Put(context.Background(), backend.Item{Key: "/x"})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
	_, err = b.NewWatcher(context.Background(), backend.Watch{})
	require.True(t, trace.IsConnectionProblem(err), "%v", err)
}

const (
	helperEnv     = "POSTERN_SQLITE_CRASH_WRITER"
	helperPathEnv = "POSTERN_SQLITE_CRASH_PATH"
)

// crashWriter runs in the child process: it puts keys as fast as it can and
// prints each index once Put has returned, i.e. once the write is committed.
// The parent kills it with SIGKILL mid-stream.
func crashWriter() {
	ctx := context.Background()
	b, err := New(ctx, Config{Path: os.Getenv(helperPathEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		if _, err := b.Put(ctx, backend.Item{Key: fmt.Sprintf("/crash/%08d", i), Value: []byte(strconv.Itoa(i))}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		fmt.Fprintln(out, i)
		out.Flush()
	}
}

// TestCrashDurability is the SIGKILL promise: every write the child was told
// had committed is there after reopening the file.
func TestCrashDurability(t *testing.T) {
	path := filepath.Join(t.TempDir(), "crash.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperPathEnv+"="+path)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	const killAfter = 200
	committed := -1
	scanner := bufio.NewScanner(stdout)
	for scanner.Scan() {
		n, err := strconv.Atoi(scanner.Text())
		require.NoError(t, err)
		committed = n
		if n == killAfter {
			// Mid-write: the child is already inside its next Put.
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			break
		}
	}
	// Drain whatever it acknowledged before the signal landed.
	for scanner.Scan() {
		if n, err := strconv.Atoi(scanner.Text()); err == nil {
			committed = n
		}
	}
	err = cmd.Wait()
	require.Error(t, err, "the child must have been killed")
	require.GreaterOrEqual(t, committed, killAfter)

	b, err := New(context.Background(), Config{Path: path})
	require.NoError(t, err)
	defer b.Close()
	items, err := b.GetRange(context.Background(), "/crash/", 0)
	require.NoError(t, err)
	// Every acknowledged key is present; at most one more (committed but
	// killed before it was printed) may be.
	require.GreaterOrEqual(t, len(items), committed+1)
	require.LessOrEqual(t, len(items), committed+2)
	for i := 0; i <= committed; i++ {
		require.Equal(t, fmt.Sprintf("/crash/%08d", i), items[i].Key)
		require.Equal(t, strconv.Itoa(i), string(items[i].Value))
	}
}

func BenchmarkSQLite(b *testing.B) {
	test.RunBackendBenchmarks(b, func(b *testing.B) backend.Backend {
		return newBackend(b, nil)
	})
}

// TestCreateMany: one transaction writes the new keys (in order, each with
// its own revision, each seen by watchers) and skips keys that exist or
// repeat within the batch; a bad item refuses the whole batch.
func TestCreateMany(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, clockwork.NewFakeClock())
	old, err := b.Put(ctx, backend.Item{Key: "/events/old", Value: []byte("old")})
	require.NoError(t, err)
	w, err := b.NewWatcher(ctx, backend.Watch{Prefixes: []string{"/events/"}})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)

	n, err := b.CreateMany(ctx, []backend.Item{
		{Key: "/events/a", Value: []byte("a")},
		{Key: "/events/old", Value: []byte("overwritten?")},
		{Key: "/events/b", Value: []byte("b")},
		{Key: "/events/a", Value: []byte("again")},
	})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for i, want := range []string{"a", "b"} {
		ev := <-w.Events()
		require.Equal(t, backend.OpPut, ev.Type)
		require.Equal(t, "/events/"+want, ev.Item.Key)
		require.Equal(t, old.Revision+int64(i)+1, ev.Item.Revision)
	}
	got, err := b.Get(ctx, "/events/old")
	require.NoError(t, err)
	require.Equal(t, "old", string(got.Value))
	got, err = b.Get(ctx, "/events/a")
	require.NoError(t, err)
	require.Equal(t, "a", string(got.Value))

	// The next single write continues the revisions.
	next, err := b.Put(ctx, backend.Item{Key: "/x", Value: []byte("x")})
	require.NoError(t, err)
	require.Equal(t, old.Revision+3, next.Revision)

	_, err = b.CreateMany(ctx, []backend.Item{{Key: "/events/c", Value: []byte("c")}, {Key: "no-slash"}})
	require.True(t, trace.IsBadParameter(err), "%v", err)
	_, err = b.Get(ctx, "/events/c")
	require.True(t, trace.IsNotFound(err), "%v", err)
}
