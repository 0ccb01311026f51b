package auth

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// TestWebSessionCerts is the web-session API as a proxy's identity sees
// it, over the real API: a record exists only from a login; the backend
// and the API hold hashes, never the secrets; a certificate needs both
// secrets and ends with the session; touches cannot extend a session into
// the future; a lock or logout stops it; deletes reach the watch, which
// carries only end ids (no keys, nothing of creations or touches).
func TestWebSessionCerts(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "alice", []byte("correct horse battery"), []string{"alice"}, nil, false)
	require.NoError(t, err)
	proxy := env.client(t, env.identity(t, "proxy-1", RoleProxy))

	sid, token := "session-id-secret", "bearer-token-secret"
	key := webSessionKeyOf(sid)
	th := sha256.Sum256([]byte(token))
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)

	w, err := proxy.WebSessionEvents(ctx)
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)

	// A wrong password creates nothing.
	_, err = proxy.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{
		AuthRequest: authapi.AuthRequest{User: "alice", Password: "wrong"},
		PublicKey:   pub, TTL: time.Hour,
		WebSession: &authapi.WebSessionInit{Key: key, TokenHash: th[:]},
	})
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	_, err = proxy.GetWebSession(ctx, sid, token)
	require.True(t, trace.IsNotFound(err), "%v", err)

	resp, err := proxy.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{
		AuthRequest: authapi.AuthRequest{User: "alice", Password: "correct horse battery"},
		PublicKey:   pub, TTL: time.Hour,
		WebSession: &authapi.WebSessionInit{Key: key, TokenHash: th[:]},
	})
	require.NoError(t, err)
	require.Equal(t, "alice", resp.Username)

	rec, err := proxy.GetWebSession(ctx, sid, token)
	require.NoError(t, err)
	require.Equal(t, "alice", rec.User)
	require.Equal(t, th[:], rec.TokenHash)
	require.Equal(t, env.clock.Now().Add(time.Hour).Unix(), rec.Expires.Unix())
	raw, err := env.store.Backend().Get(ctx, services.WebSessionKey(key))
	require.NoError(t, err)
	require.NotContains(t, string(raw.Value), token)
	require.NotContains(t, string(raw.Value), sid)

	_, pub2, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	certs := func(sid, token string) (*authapi.SSHLoginResponse, error) {
		return proxy.WebSessionCerts(ctx, authapi.WebSessionCertRequest{SessionID: sid, Token: token, PublicKey: pub2})
	}
	for name, c := range map[string][2]string{
		"wrong token":                 {sid, "guess"},
		"wrong session id":            {"guess", token},
		"the key, not the session id": {key, token},
		"no token":                    {sid, ""},
	} {
		_, err := certs(c[0], c[1])
		require.True(t, trace.IsAccessDenied(err), "%s: %v", name, err)
	}
	got, err := certs(sid, token)
	require.NoError(t, err)
	cpub, _, _, _, err := ssh.ParseAuthorizedKey(got.Cert)
	require.NoError(t, err)
	cert := cpub.(*ssh.Certificate)
	require.Equal(t, "alice", cert.KeyId)
	require.LessOrEqual(t, int64(cert.ValidBefore), rec.Expires.Unix(), "the certificate ends with the session")
	require.Equal(t, ssh.MarshalAuthorizedKey(cert.Key), pub2)

	// A touch in the future is capped at now.
	require.NoError(t, proxy.TouchWebSession(ctx, sid, token, env.clock.Now().Add(24*time.Hour)))
	rec2, err := proxy.GetWebSession(ctx, sid, token)
	require.NoError(t, err)
	require.False(t, rec2.LastActive.After(env.clock.Now()))
	require.Equal(t, "alice", rec2.User)
	require.Equal(t, rec.Expires, rec2.Expires)

	// A locked user gets no certificate.
	_, err = env.auth.UpsertLock(ctx, authapi.LockRequest{Target: services.LockTarget{User: "alice"}}, "admin")
	require.NoError(t, err)
	_, err = certs(sid, token)
	require.Error(t, err)
	require.True(t, services.IsLocked(err) || trace.IsAccessDenied(err), "%v", err)
	require.NoError(t, env.auth.DeleteLock(ctx, services.LockTarget{User: "alice"}))
	_, err = certs(sid, token)
	require.NoError(t, err)

	// Logout: the record goes and the watch says so, by the end id
	// alone: the login and the touch before it sent nothing.
	require.NoError(t, proxy.DeleteWebSession(ctx, sid, token))
	ev := nextEvent(t, w)
	require.Equal(t, backend.OpDelete, ev.Type)
	require.Equal(t, services.WebSessionsPrefix()+services.WebSessionEndID(key), ev.Item.Key)
	require.Empty(t, ev.Item.Value)
	_, err = certs(sid, token)
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	// An expired session gives nothing, even before the backend sweeps it.
	sid2, token2 := "second-session", "second-token"
	th2 := sha256.Sum256([]byte(token2))
	_, err = proxy.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{
		AuthRequest: authapi.AuthRequest{User: "alice", Password: "correct horse battery"},
		PublicKey:   pub, TTL: time.Minute,
		WebSession: &authapi.WebSessionInit{Key: webSessionKeyOf(sid2), TokenHash: th2[:]},
	})
	require.NoError(t, err)
	_, err = certs(sid2, token2)
	require.NoError(t, err)
	env.clock.Advance(time.Minute)
	_, err = certs(sid2, token2)
	require.True(t, trace.IsAccessDenied(err), "%v", err)

	// A session is named by its secrets only: its key, or half of the
	// pair, finds nothing.
	for _, bad := range [][2]string{{"../users/alice", token2}, {webSessionKeyOf(sid2), token2}, {sid2, ""}, {"", token2}} {
		_, err := env.auth.GetWebSession(ctx, bad[0], bad[1])
		require.True(t, trace.IsNotFound(err) || trace.IsBadParameter(err), "%q: %v", bad, err)
	}
}

func nextEvent(t *testing.T, w backend.Watcher) backend.Event {
	t.Helper()
	select {
	case ev := <-w.Events():
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event")
		return backend.Event{}
	}
}
