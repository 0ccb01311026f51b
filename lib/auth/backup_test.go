package auth

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/backend/backup"
	"github.com/postern-dev/postern/lib/backend/memory"
	backendtest "github.com/postern-dev/postern/lib/backend/test"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// TestBackupEndpoint: an admin streams a complete backup that restores
// the CAs with their private keys, and the read is audited.
func TestBackupEndpoint(t *testing.T) {
	env, rec := newAuditedAPI(t)
	ctx := context.Background()
	clt := env.adminClient(t)
	var buf bytes.Buffer
	require.NoError(t, clt.Backup(ctx, &buf))

	h, n, err := backup.Verify(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.Equal(t, testCluster, h.ClusterName)
	require.Positive(t, n)

	r, err := backup.NewReader(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	dst, err := memory.New(memory.Config{Clock: env.clock})
	require.NoError(t, err)
	defer dst.Close()
	_, err = backup.Restore(ctx, r, dst)
	require.NoError(t, err)
	for _, typ := range []services.CertAuthType{services.UserCA, services.HostCA} {
		want, err := env.store.GetCertAuthority(ctx, testCluster, typ, true)
		require.NoError(t, err)
		got, err := services.NewStore(dst).GetCertAuthority(ctx, testCluster, typ, true)
		require.NoError(t, err)
		require.Equal(t, want.SSHPrivateKeys, got.SSHPrivateKeys)
	}

	ev := waitEvent(t, rec, events.BackupCreate, nil)
	require.Equal(t, RoleAdmin, ev.Fields[events.FieldRole])
	require.EqualValues(t, n, ev.Fields[events.FieldCount])
	require.NotContains(t, ev.Fields, events.FieldReason)
}

// TestBackupFailureIsNeverAFile: when the backend fails under a backup
// the stream is cut without its trailer, pctl's file is never written, and
// the failure is audited with its reason.
func TestBackupFailureIsNeverAFile(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	mem, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	bk := backendtest.NewOutage(mem)
	store := services.NewStore(bk)
	rec := events.NewRecorder()
	adminDir := filepath.Join(t.TempDir(), "admin")
	srv, err := NewServer(ServerConfig{
		Store: store, ClusterName: testCluster, AdminIdentityDir: adminDir,
		BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Logger: testLogger(), Audit: rec},
	})
	require.NoError(t, err)
	env := &testEnv{clock: clock, store: store, auth: srv, adminDir: adminDir}
	startAPI(t, env)
	clt := env.adminClient(t)

	bk.Down()
	path := filepath.Join(t.TempDir(), "postern.backup")
	_, _, err = backup.WriteFile(path, func(w io.Writer) error { return clt.Backup(context.Background(), w) })
	require.Error(t, err)
	require.NoFileExists(t, path)
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Empty(t, entries, "no temporary left")
	ev := waitEvent(t, rec, events.BackupCreate, nil)
	require.Contains(t, ev.Fields[events.FieldReason], "test outage")
}
