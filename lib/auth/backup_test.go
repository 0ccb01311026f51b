package auth

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend/backup"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/events"
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
