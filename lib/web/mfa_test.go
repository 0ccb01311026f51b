package web

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// mfaEnv is a real auth server (memory backend) serving its API on
// 127.0.0.1, and a real web server on 127.0.0.1 that reaches it as a proxy
// does, through an auth.Client with a proxy identity.
type mfaEnv struct {
	clock *clockwork.FakeClock
	auth  *auth.Server
	store *services.Store
	audit *events.Recorder
	url   string
	http  *http.Client
	// nodes is what the web server lists (none until a test adds some).
	nodes *mfaNodes
}

const (
	mfaRPID   = "localhost"
	mfaOrigin = "https://localhost:3080"
	bobPasswd = "bob's password 1"
	evePasswd = "eve's password 1"
)

func newMFAEnv(t *testing.T) *mfaEnv {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	bk, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { bk.Close() })
	store := services.NewStore(bk)
	audit := events.NewRecorder()
	as, err := auth.NewServer(auth.ServerConfig{
		Store: store, ClusterName: "c1", BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Audit: audit, Logger: quietLogger()},
		Limits: auth.LoginLimits{MaxFailures: 50, MaxAddrFailures: 50, Window: time.Minute},
	})
	require.NoError(t, err)
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	api, err := auth.NewAPIServer(auth.APIConfig{Auth: as, Listener: apiLn, Deps: observe.Deps{Logger: quietLogger()}})
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- api.Serve() }()
	id, err := as.IssueIdentity(context.Background(), auth.IdentityRequest{ID: "proxy-1", Role: auth.RoleProxy, Hostname: "proxy-1"})
	require.NoError(t, err)
	clt, err := auth.NewClient(auth.ClientConfig{Addr: apiLn.Addr().String(), Identity: id, Deps: observe.Deps{Clock: clock}, Timeout: 10 * time.Second})
	require.NoError(t, err)

	pair, err := LoadOrCreateTLS(t.TempDir(), "", "", nil, time.Now())
	require.NoError(t, err)
	nodes := &mfaNodes{}
	s, err := NewServer(Config{
		ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", Certificate: pair,
		Auth: clt, SecondFactor: CachedSecondFactor(clt, clock),
		WebSessions: WebSessionsConfig{
			Router: noRoutes{}, Nodes: nodes, Roles: clt,
			Store: &AuthSessionStore{Auth: clt}, Certs: clt, Watch: clt.WebSessionEvents,
		},
		Deps: observe.Deps{Clock: clock, Logger: quietLogger()},
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		require.NoError(t, s.Shutdown(context.Background()))
		require.NoError(t, <-done)
		clt.Close()
		api.Close()
		require.NoError(t, <-served)
	})

	ctx := context.Background()
	require.NoError(t, store.SetAuthPreference(ctx, &services.AuthPreference{Spec: services.AuthPreferenceSpec{
		SecondFactor: services.SecondFactorOn,
		WebAuthn:     &services.WebAuthnPreference{RPID: mfaRPID, Origins: []string{mfaOrigin}},
		Passwordless: true,
	}}))
	for user, pw := range map[string]string{"bob": bobPasswd, "eve": evePasswd} {
		_, err := as.CreateUser(ctx, user, []byte(pw), []string{user}, nil, false)
		require.NoError(t, err)
	}
	return &mfaEnv{clock: clock, auth: as, store: store, audit: audit, url: "https://" + ln.Addr().String(), http: &http.Client{Transport: tr}, nodes: nodes}
}

// do sends a JSON request, with ws's cookie and token when set.
func (e *mfaEnv) do(t *testing.T, method, path string, body any, ws webSession) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	require.NoError(t, err)
	if ws.cookie != nil {
		req.AddCookie(&http.Cookie{Name: SessionCookieName, Value: ws.cookie.Value})
	}
	if ws.token != "" {
		req.Header.Set("Authorization", "Bearer "+ws.token)
	}
	resp, err := e.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, data
}

// passwordSession logs a user without factors in with the password alone
// (the preference, which requires a factor, is lifted meanwhile): the
// session in which they register their first passkey.
func (e *mfaEnv) passwordSession(t *testing.T, user, pw string) webSession {
	t.Helper()
	ctx := context.Background()
	pref, err := e.store.GetAuthPreference(ctx)
	require.NoError(t, err)
	require.NoError(t, e.store.DeleteAuthPreference(ctx))
	defer func() { require.NoError(t, e.store.SetAuthPreference(ctx, pref)) }()
	req, err := http.NewRequest(http.MethodPost, e.url+"/webapi/sessions", bytes.NewReader([]byte(fmt.Sprintf(`{"user":%q,"password":%q}`, user, pw))))
	require.NoError(t, err)
	resp, err := e.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(data))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(data, &out))
	ws := webSession{token: out.Token}
	for _, c := range resp.Cookies() {
		if c.Name == SessionCookieName {
			ws.cookie = c
		}
	}
	require.NotNil(t, ws.cookie)
	return ws
}

// register adds k to ws's user as name.
func (e *mfaEnv) register(t *testing.T, ws webSession, k *softKey, name string) {
	t.Helper()
	code, body := e.do(t, http.MethodPost, "/webapi/mfa/register/begin", map[string]string{"name": name}, ws)
	require.Equal(t, http.StatusOK, code, string(body))
	var ch authapi.MFAChallenge
	require.NoError(t, json.Unmarshal(body, &ch))
	code, body = e.do(t, http.MethodPost, "/webapi/mfa/register/finish", map[string]any{
		"challenge_id": ch.ChallengeID, "webauthn": json.RawMessage(k.create(t, ch.WebAuthn, mfaOrigin, "")),
	}, ws)
	require.Equal(t, http.StatusOK, code, string(body))
}

// beginLogin starts a password + passkey login.
func (e *mfaEnv) beginLogin(t *testing.T, user, pw string) authapi.MFAChallenge {
	t.Helper()
	code, body := e.do(t, http.MethodPost, "/webapi/mfa/login/begin", map[string]any{"user": user, "password": pw}, webSession{})
	require.Equal(t, http.StatusOK, code, string(body))
	var ch authapi.MFAChallenge
	require.NoError(t, json.Unmarshal(body, &ch))
	return ch
}

// finish sends an answer to a login challenge.
func (e *mfaEnv) finish(t *testing.T, id string, answer []byte) (int, []byte) {
	t.Helper()
	return e.do(t, http.MethodPost, "/webapi/mfa/login/finish", map[string]any{"challenge_id": id, "webauthn": json.RawMessage(answer)}, webSession{})
}
