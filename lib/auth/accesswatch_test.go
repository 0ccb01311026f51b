package auth

import (
	"context"
	"encoding/base64"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// TestWatchAccessNeverCarriesSecrets is the attack on the access watch: a
// node's identity asks for every CA event, explicitly, and a CA carrying
// private keys is written. The stream carries the public keys only; keys
// outside roles and CAs are refused; and an AccessCache fed by the stream
// serves the CA and a role edited after it started.
func TestWatchAccessNeverCarriesSecrets(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	node := env.client(t, env.identity(t, "node-1", RoleNode))
	events := node.AccessEvents()

	w, err := events.NewWatcher(ctx, backend.Watch{Prefixes: []string{services.AuthoritiesPrefix(), services.RolesPrefix()}})
	require.NoError(t, err)
	defer w.Close()
	next := func() backend.Event {
		t.Helper()
		select {
		case ev := <-w.Events():
			return ev
		case <-w.Done():
			t.Fatalf("watcher stopped: %v", w.Error())
		case <-time.After(10 * time.Second):
			t.Fatal("timed out waiting for a watch event")
		}
		return backend.Event{}
	}
	require.Equal(t, backend.OpInit, next().Type)

	secret := []byte("-----BEGIN OPENSSH PRIVATE KEY----- TOPSECRET")
	require.NoError(t, env.store.CreateCertAuthority(ctx, services.CertAuthority{
		Type: services.UserCA, ClusterName: "other",
		SSHPublicKeys:  []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBkUbBvYpgJ5bDcrnYi2dDpSTR0oXEJnB5ZUP9wEFwXO"},
		SSHPrivateKeys: [][]byte{secret},
		TLSKey:         secret,
	}))
	ev := next()
	require.Equal(t, backend.OpPut, ev.Type)
	require.Contains(t, string(ev.Item.Value), "AAAAC3NzaC1lZDI1NTE5AAAAIBkUbBvYpgJ5bDcrnYi2dDpSTR0oXEJnB5ZUP9wEFwXO")
	require.NotContains(t, string(ev.Item.Value), "TOPSECRET")
	require.NotContains(t, string(ev.Item.Value), base64.StdEncoding.EncodeToString(secret)[:20], "not even base64-encoded")
	require.NotContains(t, string(ev.Item.Value), "private")

	for _, prefix := range []string{"/users/", "/tokens/", services.LocksPrefix(), "/"} {
		_, err = events.NewWatcher(ctx, backend.Watch{Prefixes: []string{prefix}})
		require.True(t, trace.IsAccessDenied(err), "prefix %q: %v", prefix, err)
	}

	cache, err := services.NewAccessCache(services.AccessCacheConfig{Events: events, Clock: env.clock})
	require.NoError(t, err)
	defer cache.Close()
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, cache.WaitSynced(waitCtx))
	ca, err := cache.GetCertAuthority(ctx, "other", services.UserCA, false)
	require.NoError(t, err)
	require.Empty(t, ca.SSHPrivateKeys)
	require.Empty(t, ca.TLSKey)
	ca, err = cache.GetCertAuthority(ctx, testCluster, services.HostCA, false)
	require.NoError(t, err, "the cluster's own host CA, loaded at start")
	require.Empty(t, ca.TLSKey)
	require.Empty(t, ca.SSHPrivateKeys)

	require.NoError(t, env.store.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: "late"}, Spec: services.RoleSpec{Logins: []string{"x"}}}))
	require.Eventually(t, func() bool {
		r, err := cache.GetRole(ctx, "late")
		return err == nil && r.Spec.Logins[0] == "x"
	}, 10*time.Second, 5*time.Millisecond, "a role written after the load reaches the cache")
}
