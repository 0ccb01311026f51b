package backup

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/etcdbk"
	"github.com/postern-dev/postern/lib/backend/etcdbk/etcdtest"
	"github.com/postern-dev/postern/lib/backend/schema"
	"github.com/postern-dev/postern/lib/backend/sqlite"
)

func newSQLite(t *testing.T, clock clockwork.Clock) *sqlite.Backend {
	b, err := sqlite.New(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "postern.db"), Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func newEtcd(t *testing.T, srv *etcdtest.Server, prefix string) *etcdbk.Backend {
	b, err := etcdbk.New(context.Background(), etcdbk.Config{Endpoints: srv.Endpoints, Prefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// fill writes a small cluster's worth of items: binary values, an empty
// value, expiring and permanent items, and the schema record.
func fill(t *testing.T, b backend.Backend) {
	ctx := context.Background()
	require.NoError(t, schema.Migrate(ctx, b, nil))
	far := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	for i := range 600 {
		it := backend.Item{Key: fmt.Sprintf("/events/%04d", i), Value: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		if i%3 == 0 {
			it.Expires = far
		}
		_, err := b.Put(ctx, it)
		require.NoError(t, err)
	}
	for _, it := range []backend.Item{
		{Key: "/authorities/user/c1", Value: []byte{0, 1, 2, 0xff, '\n', '"'}},
		{Key: "/users/alice", Value: []byte(`{"name":"alice"}`)},
		{Key: "/empty", Value: []byte{}},
		{Key: "/nodes/c1/u1", Value: []byte(`{}`), Expires: far},
	} {
		_, err := b.Put(ctx, it)
		require.NoError(t, err)
	}
}

// dump lists b's items without revisions, for comparing backends.
func dump(t *testing.T, b backend.Backend) []backend.Item {
	items, err := b.GetRange(context.Background(), backend.Separator, 0)
	require.NoError(t, err)
	for i := range items {
		items[i].Revision = 0
		if items[i].Value == nil {
			items[i].Value = []byte{}
		}
		if !items[i].Expires.IsZero() {
			items[i].Expires = items[i].Expires.UTC()
		}
	}
	return items
}

func roundTrip(t *testing.T, src, dst backend.Backend) []byte {
	ctx := context.Background()
	var buf bytes.Buffer
	n, err := Write(ctx, &buf, src, Header{ClusterName: "c1", Backend: "test"})
	require.NoError(t, err)
	want := dump(t, src)
	require.Equal(t, len(want), n)
	r, err := NewReader(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.Equal(t, "c1", r.Header.ClusterName)
	require.Equal(t, schema.Version, r.Header.SchemaVersion)
	written, err := Restore(ctx, r, dst)
	require.NoError(t, err)
	require.Equal(t, n, written)
	require.Equal(t, want, dump(t, dst))
	return buf.Bytes()
}

// TestEtcdToSQLiteAndBack: a backup of an etcd prefix restores into a
// SQLite file, whose backup restores into another etcd prefix, with every
// item, value and expiry intact.
func TestEtcdToSQLiteAndBack(t *testing.T) {
	srv := etcdtest.Start(t)
	from := newEtcd(t, srv, "/postern-a")
	fill(t, from)
	lite := newSQLite(t, nil)
	roundTrip(t, from, lite)
	to := newEtcd(t, srv, "/postern-b")
	roundTrip(t, lite, to)
	require.Equal(t, dump(t, from), dump(t, to))
}

// TestRestoreRefusesNonEmptyBackend: a restore never merges, and leaves
// the destination as it was.
func TestRestoreRefusesNonEmptyBackend(t *testing.T) {
	ctx := context.Background()
	src := newSQLite(t, nil)
	fill(t, src)
	var buf bytes.Buffer
	_, err := Write(ctx, &buf, src, Header{ClusterName: "c1"})
	require.NoError(t, err)
	dst := newSQLite(t, nil)
	_, err = dst.Put(ctx, backend.Item{Key: "/users/bob", Value: []byte("{}")})
	require.NoError(t, err)
	r, err := NewReader(&buf)
	require.NoError(t, err)
	_, err = Restore(ctx, r, dst)
	require.ErrorContains(t, err, "not empty (it holds /users/bob)")
	require.Len(t, dump(t, dst), 1)
}

// TestRestoreSkipsExpired: items that expired since the backup are not
// brought back.
func TestRestoreSkipsExpired(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClockAt(time.Now())
	src := newSQLite(t, clock)
	_, err := src.Put(ctx, backend.Item{Key: "/nodes/c1/u1", Value: []byte("{}"), Expires: clock.Now().Add(time.Minute)})
	require.NoError(t, err)
	_, err = src.Put(ctx, backend.Item{Key: "/users/alice", Value: []byte("{}")})
	require.NoError(t, err)
	var buf bytes.Buffer
	_, err = Write(ctx, &buf, src, Header{})
	require.NoError(t, err)
	dst := newSQLite(t, clockwork.NewFakeClockAt(clock.Now().Add(2*time.Minute)))
	r, err := NewReader(&buf)
	require.NoError(t, err)
	n, err := Restore(ctx, r, dst)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// TestBackupWhileWriting: a snapshot taken while a writer goes on is the
// backend as of one moment: the writer bumps a counter key after each
// item, so every item numbered at most the counter's value is there.
func TestBackupWhileWriting(t *testing.T) {
	ctx := context.Background()
	src := newSQLite(t, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := src.Put(ctx, backend.Item{Key: fmt.Sprintf("/items/%06d", i), Value: []byte("x")}); err != nil {
				return
			}
			if _, err := src.Put(ctx, backend.Item{Key: "/count", Value: []byte(fmt.Sprint(i + 1))}); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	require.Eventually(t, func() bool { it, err := src.Get(ctx, "/count"); return err == nil && len(it.Value) >= 3 }, 10*time.Second, time.Millisecond)
	for range 3 {
		var buf bytes.Buffer
		_, err := Write(ctx, &buf, src, Header{})
		require.NoError(t, err)
		r, err := NewReader(&buf)
		require.NoError(t, err)
		count, items := -1, 0
		for {
			it, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			if it.Key == "/count" {
				_, err := fmt.Sscan(string(it.Value), &count)
				require.NoError(t, err)
			} else if strings.HasPrefix(it.Key, "/items/") {
				items++
			}
		}
		// One moment: the counter says n, so n or n+1 items exist (the
		// item is written before its count), never fewer or more.
		require.GreaterOrEqual(t, items, count)
		require.LessOrEqual(t, items, count+1)
	}
}

// TestTruncatedAndDamagedBackupsAreRefused: only a backup with its
// trailer, in one piece, is accepted.
func TestTruncatedAndDamagedBackupsAreRefused(t *testing.T) {
	ctx := context.Background()
	src := newSQLite(t, nil)
	fill(t, src)
	var buf bytes.Buffer
	_, err := Write(ctx, &buf, src, Header{ClusterName: "c1"})
	require.NoError(t, err)
	full := buf.Bytes()

	_, n, err := Verify(bytes.NewReader(full))
	require.NoError(t, err)
	require.Equal(t, len(dump(t, src)), n)

	for _, cut := range []int{10, len(full) / 2, len(full) - 9} {
		_, _, err := Verify(bytes.NewReader(full[:cut]))
		require.Error(t, err, "cut at %d of %d", cut, len(full))
	}
	// A stream whose gzip is complete but whose lines stop early (a writer
	// that failed midway and closed its gzip) lacks the trailer.
	lines := plain(t, full)
	cutLines := strings.Join(lines[:len(lines)/2], "\n") + "\n"
	_, _, err = Verify(bytes.NewReader(gz(t, cutLines)))
	require.ErrorContains(t, err, "incomplete")
	// A trailer that does not match.
	bad := strings.Join(append(append([]string{}, lines[:len(lines)-1]...), `{"end":{"items":1}}`), "\n")
	_, _, err = Verify(bytes.NewReader(gz(t, bad)))
	require.ErrorContains(t, err, "trailer counts 1 items")
	_, _, err = Verify(strings.NewReader("hello"))
	require.ErrorContains(t, err, "not a Postern backup")
}

// TestNewerBackupIsRefused: a backup of a newer schema or format names
// both versions.
func TestNewerBackupIsRefused(t *testing.T) {
	ctx := context.Background()
	src := newSQLite(t, nil)
	fill(t, src)
	var buf bytes.Buffer
	_, err := Write(ctx, &buf, src, Header{ClusterName: "c1"})
	require.NoError(t, err)
	lines := plain(t, buf.Bytes())
	var h map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &h))

	h["schema_version"] = schema.Version + 1
	_, err = NewReader(bytes.NewReader(gz(t, withHeader(t, h, lines))))
	require.ErrorContains(t, err, fmt.Sprintf("schema version is %d, newer than version %d", schema.Version+1, schema.Version))

	h["schema_version"] = schema.Version
	h["format_version"] = FormatVersion + 1
	_, err = NewReader(bytes.NewReader(gz(t, withHeader(t, h, lines))))
	require.ErrorContains(t, err, fmt.Sprintf("format version is %d, this Postern (dev) reads versions 1 to %d", FormatVersion+1, FormatVersion))
}

// TestWriteFile: 0600, atomic, and nothing left when the stream fails.
func TestWriteFile(t *testing.T) {
	ctx := context.Background()
	src := newSQLite(t, nil)
	fill(t, src)
	dir := t.TempDir()
	path := filepath.Join(dir, "postern.backup")
	h, n, err := WriteFile(path, func(w io.Writer) error {
		_, err := Write(ctx, w, src, Header{ClusterName: "c1"})
		return err
	})
	require.NoError(t, err)
	require.Equal(t, "c1", h.ClusterName)
	require.Equal(t, len(dump(t, src)), n)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	good, err := os.ReadFile(path)
	require.NoError(t, err)

	// A stream that breaks midway: the old backup stays, no temporary.
	_, _, err = WriteFile(path, func(w io.Writer) error {
		_, err := w.Write(good[:len(good)/2])
		require.NoError(t, err)
		return errors.New("connection reset")
	})
	require.ErrorContains(t, err, "connection reset")
	// A stream that ends early without an error (the server aborted).
	_, _, err = WriteFile(path, func(w io.Writer) error {
		_, err := w.Write(good[:len(good)/2])
		return err
	})
	require.ErrorContains(t, err, "not complete")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, good, after)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary left behind")
}

func plain(t *testing.T, data []byte) []string {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	raw, err := io.ReadAll(zr)
	require.NoError(t, err)
	return strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
}

func gz(t *testing.T, s string) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

func withHeader(t *testing.T, h map[string]any, lines []string) string {
	data, err := json.Marshal(h)
	require.NoError(t, err)
	return strings.Join(append([]string{string(data)}, lines[1:]...), "\n") + "\n"
}
