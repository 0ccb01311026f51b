package schema_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend/schema"
	"github.com/postern-dev/postern/lib/backend/sqlite"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// Fixture contents, which tests of later releases rely on.
const (
	FixtureCluster  = "fixture"
	FixturePassword = "correct horse battery"
)

// TestWriteFixture writes a data dir as fixtures/datadir-v1 holds it,
// with this release's code: an auth server's SQLite backend holding its
// CAs, the preset roles, a role "ops", a user alice (password
// FixturePassword, logins alice and root, roles access and ops) and a node
// "fixture-node" whose record expires in 2126. It writes into a temporary
// dir and reads it back, so that every run proves this release can still
// write what the fixture stands for; with POSTERN_WRITE_FIXTURE=1 it
// (re)writes fixtures/datadir-v1 itself, which is done once, by the
// release whose data the fixture stands for, and kept.
func TestWriteFixture(t *testing.T) {
	dir := t.TempDir()
	if os.Getenv("POSTERN_WRITE_FIXTURE") == "1" {
		dir = fixtureDir
		require.NoError(t, os.RemoveAll(dir))
	}
	ctx := context.Background()
	b, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "backend", "postern.db")})
	require.NoError(t, err)
	require.NoError(t, schema.Migrate(ctx, b, nil))
	store := services.NewStore(b)
	srv, err := auth.NewServer(auth.ServerConfig{
		Store:            store,
		ClusterName:      FixtureCluster,
		AdminIdentityDir: t.TempDir(),
		BcryptCost:       bcrypt.MinCost,
		Recordings:       recording.DirStorage{Dir: t.TempDir()},
	})
	require.NoError(t, err)
	ops := &services.Role{Metadata: services.Metadata{Name: "ops", Description: "fixture role"},
		Spec: services.RoleSpec{Logins: []string{"root"}, NodeLabels: map[string]services.LabelValues{"env": {"fixture"}}}}
	require.NoError(t, ops.CheckAndSetDefaults())
	require.NoError(t, store.UpsertRole(ctx, ops))
	_, err = srv.CreateUser(ctx, "alice", []byte(FixturePassword), []string{"alice", "root"}, []string{services.PresetAccessRole, "ops"}, false)
	require.NoError(t, err)
	require.NoError(t, store.UpsertNode(ctx, services.Node{
		UUID: "00000000-0000-4000-8000-000000000001", Hostname: "fixture-node", Addr: "127.0.0.1:3022",
		Labels: map[string]string{"env": "fixture"}, Cluster: FixtureCluster,
		Expires:       time.Date(2126, 1, 1, 0, 0, 0, 0, time.UTC),
		LastHeartbeat: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC),
	}))
	require.NoError(t, b.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cluster_name"), []byte(FixtureCluster+"\n"), 0o600))
	require.NoFileExists(t, filepath.Join(dir, "backend", "postern.db-wal"), "closed cleanly: one file")
	checkFixture(t, copyDir(t, dir))
}

// TestFixtureHoldsWhatItSays reads the fixture as this release does.
func TestFixtureHoldsWhatItSays(t *testing.T) {
	checkFixture(t, copyDir(t, fixtureDir))
}

// checkFixture reads the data dir dir as this release does and finds what
// the fixture holds.
func checkFixture(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	b, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "backend", "postern.db")})
	require.NoError(t, err)
	defer b.Close()
	store := services.NewStore(b)
	users, err := store.GetUsers(ctx)
	require.NoError(t, err)
	require.Len(t, users, 1)
	require.Equal(t, "alice", users[0].Name)
	_, err = store.GetRole(ctx, "ops")
	require.NoError(t, err)
	nodes, err := store.GetNodes(ctx, FixtureCluster)
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	require.Equal(t, "fixture-node", nodes[0].Hostname)
	for _, typ := range []services.CertAuthType{services.UserCA, services.HostCA} {
		ca, err := store.GetCertAuthority(ctx, FixtureCluster, typ, true)
		require.NoError(t, err)
		require.NotEmpty(t, ca.SSHPrivateKeys)
	}
}
