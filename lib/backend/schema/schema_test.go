package schema_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/backend/schema"
	"github.com/postern-dev/postern/lib/backend/sqlite"
)

func newMemory(t *testing.T) backend.Backend {
	b, err := memory.New(memory.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func read(t *testing.T, b backend.Backend) schema.Record {
	rec, item, err := schema.Read(context.Background(), b)
	require.NoError(t, err)
	require.NotNil(t, item, "the backend records its schema")
	return rec
}

// counting is a migration list up to version to whose steps count their
// runs; step 2 rewrites every user item, as a real layout change would.
func counting(to int, runs map[int]int) []schema.Step {
	steps := schema.Steps()
	for v := 2; v <= to; v++ {
		steps = append(steps, schema.Step{To: v, Name: fmt.Sprintf("test step %d", v), Apply: func(ctx context.Context, b backend.Backend) error {
			runs[v]++
			if v != 2 {
				return nil
			}
			users, err := b.GetRange(ctx, "/users/", 0)
			if err != nil {
				return err
			}
			for _, u := range users {
				u.Value = []byte(strings.Replace(string(u.Value), `"name"`, `"name_v2"`, 1))
				if _, err := b.Put(ctx, u); err != nil {
					return err
				}
			}
			return nil
		}})
	}
	return steps
}

func TestNewBackendIsStampedWithTheCurrentVersion(t *testing.T) {
	b := newMemory(t)
	require.NoError(t, schema.Migrate(context.Background(), b, nil))
	rec := read(t, b)
	require.Equal(t, schema.Version, rec.Version)
	require.Empty(t, rec.Applied, "nothing to migrate on a new backend")
	// Opening again changes nothing.
	require.NoError(t, schema.Migrate(context.Background(), b, nil))
	require.Equal(t, rec, read(t, b))
}

// TestUnversionedBackendIsMigrated: data of a release before versioning
// (no version item) is version 0 and goes through every step.
func TestUnversionedBackendIsMigrated(t *testing.T) {
	ctx := context.Background()
	b := newMemory(t)
	_, err := b.Put(ctx, backend.Item{Key: "/users/alice", Value: []byte(`{"name":"alice"}`)})
	require.NoError(t, err)
	runs := map[int]int{}
	m := schema.Migrator{Current: 3, Steps: counting(3, runs)}
	require.NoError(t, m.Run(ctx, b))
	rec := read(t, b)
	require.Equal(t, 3, rec.Version)
	require.Len(t, rec.Applied, 3)
	for i, a := range rec.Applied {
		require.Equal(t, i+1, a.To)
		require.NotEmpty(t, a.Name)
		require.False(t, a.At.IsZero())
	}
	require.Equal(t, map[int]int{2: 1, 3: 1}, runs)
	// Each step once: a second open applies nothing.
	require.NoError(t, m.Run(ctx, b))
	require.Equal(t, map[int]int{2: 1, 3: 1}, runs)
	require.Len(t, read(t, b).Applied, 3)
}

// TestNewerBackendIsRefused: an older Postern names both versions and
// leaves the backend as it found it.
func TestNewerBackendIsRefused(t *testing.T) {
	ctx := context.Background()
	b := newMemory(t)
	newer := schema.Migrator{Current: 3, Steps: counting(3, map[int]int{})}
	require.NoError(t, newer.Run(ctx, b))
	before := read(t, b)

	err := schema.Migrate(ctx, b, nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "schema version is 3, newer than version 1 of this Postern")
	older := schema.Migrator{Current: 2, Steps: counting(2, map[int]int{})}
	err = older.Run(ctx, b)
	require.Error(t, err)
	require.Contains(t, err.Error(), "schema version is 3, newer than version 2")
	require.Equal(t, before, read(t, b))
}

func TestBadMigrationLists(t *testing.T) {
	b := newMemory(t)
	for _, m := range []schema.Migrator{
		{Current: 0, Steps: schema.Steps()},
		{Current: 2, Steps: schema.Steps()},
		{Current: 1, Steps: []schema.Step{{To: 2, Name: "gap", Apply: schema.Steps()[0].Apply}}},
	} {
		require.Error(t, m.Run(context.Background(), b))
	}
}

// TestFailedStepIsRetriedOnNextOpen: a step that fails leaves the backend
// at the version before it, so the next start runs it again.
func TestFailedStepIsRetriedOnNextOpen(t *testing.T) {
	ctx := context.Background()
	b := newMemory(t)
	require.NoError(t, schema.Migrate(ctx, b, nil))
	fail := true
	steps := append(schema.Steps(), schema.Step{To: 2, Name: "flaky", Apply: func(context.Context, backend.Backend) error {
		if fail {
			return fmt.Errorf("disk on fire")
		}
		return nil
	}})
	m := schema.Migrator{Current: 2, Steps: steps}
	err := m.Run(ctx, b)
	require.ErrorContains(t, err, "migrating the backend to schema version 2 (flaky)")
	require.Equal(t, 1, read(t, b).Version)
	fail = false
	require.NoError(t, m.Run(ctx, b))
	require.Equal(t, 2, read(t, b).Version)
}

// fixtureDir is a data dir written by this release (see TestWriteFixture):
// the test of the next release's migration starts from it.
const fixtureDir = "../../../fixtures/datadir-v1"

// copyDir copies the fixture so that no test writes into it.
func copyDir(t *testing.T, src string) string {
	dst := t.TempDir()
	require.NoError(t, filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o600)
	}))
	return dst
}

// TestMigrateFixtureDataDir opens a copy of the previous release's data
// dir with a next version's migration list: the step runs once, rewrites
// the data, and is recorded; opening again runs nothing.
func TestMigrateFixtureDataDir(t *testing.T) {
	ctx := context.Background()
	dir := copyDir(t, fixtureDir)
	open := func() backend.Backend {
		b, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "backend", "postern.db")})
		require.NoError(t, err)
		return b
	}
	b := open()
	require.Equal(t, 1, read(t, b).Version, "the fixture is at schema version 1")
	// Today's code opens it as it is.
	require.NoError(t, schema.Migrate(ctx, b, nil))
	require.Equal(t, 1, read(t, b).Version)

	runs := map[int]int{}
	next := schema.Migrator{Current: 2, Steps: counting(2, runs)}
	require.NoError(t, next.Run(ctx, b))
	require.Equal(t, map[int]int{2: 1}, runs)
	alice, err := b.Get(ctx, "/users/alice")
	require.NoError(t, err)
	var u map[string]any
	require.NoError(t, json.Unmarshal(alice.Value, &u))
	require.Equal(t, "alice", u["name_v2"], "step 2 rewrote the user")
	require.NoError(t, b.Close())

	b = open()
	defer b.Close()
	require.NoError(t, next.Run(ctx, b))
	require.Equal(t, map[int]int{2: 1}, runs, "applied once")
	rec := read(t, b)
	require.Equal(t, 2, rec.Version)
	require.Equal(t, []int{2}, []int{rec.Applied[len(rec.Applied)-1].To})
	// And this release now refuses the migrated data dir.
	require.ErrorContains(t, schema.Migrate(ctx, b, nil), "schema version is 2, newer than version 1")
}
