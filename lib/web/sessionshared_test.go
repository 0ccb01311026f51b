package web

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/observe"
)

// sharedEnv is two web servers (two proxies) on one auth server and one
// backend, as a cluster on etcd has them.
type sharedEnv struct {
	env  *loginEnv
	a, b *Server
	// watchesB receives every watcher B's session watch starts.
	watchesB chan backend.Watcher
}

func newSharedEnv(t *testing.T) *sharedEnv {
	t.Helper()
	env := newLoginEnv(t)
	_, err := env.auth.CreateUser(context.Background(), testUser, []byte(testPassword), []string{"alice"}, nil, false)
	require.NoError(t, err)
	pair, err := LoadOrCreateTLS(t.TempDir(), "", "", nil, time.Now())
	require.NoError(t, err)
	e := &sharedEnv{env: env, watchesB: make(chan backend.Watcher, 8)}
	mk := func(watch SessionWatch) *Server {
		s, err := NewServer(Config{
			ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", Certificate: pair, Auth: env.auth,
			WebSessions: WebSessionsConfig{
				Router: noRoutes{}, Nodes: noNodes{}, Roles: env.store,
				Store: &BackendSessionStore{Backend: env.store.Backend()},
				Certs: env.auth, Watch: watch,
			},
			Deps: observe.Deps{Clock: env.clock, Logger: quietLogger()},
		})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Shutdown(context.Background())) })
		return s
	}
	e.a = mk(env.auth.WebSessionEvents)
	e.b = mk(func(ctx context.Context) (backend.Watcher, error) {
		w, err := env.auth.WebSessionEvents(ctx)
		if err == nil {
			e.watchesB <- w
		}
		return w, err
	})
	return e
}

// call runs one request on s with the session's cookie and token.
func call(s *Server, method, path, cookie, token string, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: SessionCookieName, Value: cookie})
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	s.srv.Handler.ServeHTTP(rec, req)
	return rec
}

func (e *sharedEnv) login(t *testing.T) (cookie, token string) {
	t.Helper()
	rec := call(e.a, http.MethodPost, "/webapi/sessions", "", "", `{"user":"alice","password":"`+testPassword+`","otp_token":""}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var resp webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
	for _, ck := range rec.Result().Cookies() {
		if ck.Name == SessionCookieName {
			return ck.Value, resp.Token
		}
	}
	t.Fatal("no cookie")
	return "", ""
}

func waitEnded(t *testing.T, live *liveSession, what string) {
	t.Helper()
	select {
	case <-live.ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the session was not ended", what)
	}
}

// TestSharedSessionAdoptAndLogout: a session made on A is served by B
// with a key of B's own; a wrong token is not adopted; a logout on A ends
// it on B through the watch.
func TestSharedSessionAdoptAndLogout(t *testing.T) {
	e := newSharedEnv(t)
	<-e.watchesB
	cookie, token := e.login(t)
	key := keyOfCookie(cookie)

	rec := call(e.b, http.MethodGet, "/webapi/nodes", cookie, "not-the-token", "")
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Nil(t, e.b.web.sessions.get(key), "a wrong token adopts nothing")

	rec = call(e.b, http.MethodGet, "/webapi/nodes", cookie, token, "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	liveA, liveB := e.a.web.sessions.get(key), e.b.web.sessions.get(key)
	require.NotNil(t, liveB)
	require.Equal(t, "alice", liveB.user)
	require.NotEqual(t, liveA.signer.PublicKey().Marshal(), liveB.signer.PublicKey().Marshal(), "B has a key of its own")
	require.LessOrEqual(t, liveB.expires, liveA.expires)

	rec = call(e.a, http.MethodDelete, "/webapi/sessions", cookie, token, "")
	require.Equal(t, http.StatusNoContent, rec.Code)
	waitEnded(t, liveB, "logout on A")
	require.Equal(t, http.StatusUnauthorized, call(e.b, http.MethodGet, "/webapi/nodes", cookie, token, "").Code)
}

// TestSharedSessionResync: B's watch breaks, the session is logged out
// on A meanwhile (B cannot hear it); when B's watch is back, B re-syncs
// and ends it.
func TestSharedSessionResync(t *testing.T) {
	e := newSharedEnv(t)
	w := <-e.watchesB
	cookie, token := e.login(t)
	key := keyOfCookie(cookie)
	require.Equal(t, http.StatusOK, call(e.b, http.MethodGet, "/webapi/nodes", cookie, token, "").Code)
	liveB := e.b.web.sessions.get(key)
	require.NotNil(t, liveB)

	w.Close() // the watch breaks; B backs off on the fake clock
	require.NoError(t, e.env.store.DeleteWebSession(context.Background(), key))
	select {
	case <-liveB.ctx.Done():
		t.Fatal("B cannot have heard of the delete")
	default:
	}
	// Move the fake clock past B's backoff until B watches again (B may
	// not be waiting yet when the clock first moves).
	deadline := time.After(10 * time.Second)
	for rewatched := false; !rewatched; {
		e.env.clock.Advance(sessionWatchMaxBackoff)
		select {
		case <-e.watchesB:
			rewatched = true
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatal("B never watched again")
		}
	}
	waitEnded(t, liveB, "re-sync after the watch came back")
}

// TestSharedSessionAuthDown: when the record cannot be read the answer
// is 503, not 401 (the browser must not drop a valid session).
func TestSharedSessionAuthDown(t *testing.T) {
	e := newSharedEnv(t)
	<-e.watchesB
	cookie, token := e.login(t)
	e.b.cfg.WebSessions.Store = downStore{}
	rec := call(e.b, http.MethodGet, "/webapi/nodes", cookie, token, "")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), msgAuthUnavailable)
}

type downStore struct{ SessionStore }

func (downStore) GetSession(context.Context, SessionRef) (*SessionRecord, error) {
	return nil, trace.ConnectionProblem(nil, "etcd at http://127.0.0.1:2379: no answer in time")
}

func keyOfCookie(cookie string) string { return hex.EncodeToString(hashSecret(cookie)) }
