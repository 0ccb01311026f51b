package web

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// fakeSSO is the real auth server for everything but single sign-on,
// whose three calls it fakes: the proxy's handlers are tested here, auth's
// side (and a real identity provider) in integration/.
type fakeSSO struct {
	*auth.Server
	store SessionStore

	mu         sync.Mutex
	starts     []authapi.SSOAuthRequest
	callbacks  []authapi.SSOCallbackRequest
	listCalls  int
	connectors []authapi.SSOConnectorInfo
	listErr    error
	startErr   error
	// callback answers ValidateSSOCallback; nil means a browser login of
	// alice that returns to the start's ReturnTo.
	callback func(req authapi.SSOCallbackRequest) (*authapi.SSOCallbackResponse, error)
}

func (f *fakeSSO) CreateSSOAuthRequest(ctx context.Context, req authapi.SSOAuthRequest) (*authapi.SSOAuthResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, req)
	if f.startErr != nil {
		return nil, f.startErr
	}
	return &authapi.SSOAuthResponse{AuthURL: "https://idp.example/authorize?state=s1&redirect_uri=" + url.QueryEscape(req.RedirectURL)}, nil
}

func (f *fakeSSO) ValidateSSOCallback(ctx context.Context, req authapi.SSOCallbackRequest) (*authapi.SSOCallbackResponse, error) {
	f.mu.Lock()
	f.callbacks = append(f.callbacks, req)
	cb := f.callback
	var returnTo string
	if n := len(f.starts); n > 0 {
		returnTo = f.starts[n-1].ReturnTo
	}
	f.mu.Unlock()
	if cb != nil {
		return cb(req)
	}
	// What auth does for a browser: create the record the proxy made the
	// secrets of, bound to the user the provider proved.
	now := time.Now()
	rec := SessionRecord{User: testUser, TokenHash: req.WebSession.TokenHash, Created: now, Expires: now.Add(time.Hour), LastActive: now}
	if err := f.store.(*BackendSessionStore).put(ctx, req.WebSession.Key, rec, true); err != nil {
		return nil, trace.Wrap(err)
	}
	return &authapi.SSOCallbackResponse{Username: testUser, ReturnTo: returnTo}, nil
}

func (f *fakeSSO) GetSSOConnectors(ctx context.Context) ([]authapi.SSOConnectorInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listCalls++
	return f.connectors, f.listErr
}

type ssoEnv struct {
	env *loginEnv
	sso *fakeSSO
	s   *Server
}

func newSSOEnv(t *testing.T, publicAddrs ...string) *ssoEnv {
	t.Helper()
	env := newLoginEnv(t)
	_, err := env.auth.CreateUser(context.Background(), testUser, []byte(testPassword), []string{"alice"}, nil, false)
	require.NoError(t, err)
	store := &BackendSessionStore{Backend: env.store.Backend()}
	f := &fakeSSO{Server: env.auth, store: store}
	pair, err := LoadOrCreateTLS(t.TempDir(), "", "", nil, time.Now())
	require.NoError(t, err)
	if len(publicAddrs) == 0 {
		publicAddrs = []string{"proxy.example.com:3080", "proxy.example.com", "127.0.0.1:3080"}
	}
	s, err := NewServer(Config{
		ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", Certificate: pair, Auth: f,
		PublicWebAddrs: publicAddrs,
		WebSessions: WebSessionsConfig{
			Router: noRoutes{}, Nodes: noNodes{}, Roles: env.store, Store: store, Certs: env.auth,
		},
		Deps: observe.Deps{Clock: env.clock, Logger: quietLogger()},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Shutdown(context.Background())) })
	return &ssoEnv{env: env, sso: f, s: s}
}

// get runs a GET on the server as a browser would, at host, with
// cookies.
func (e *ssoEnv) get(host, target string, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.Host = host
	for _, c := range cookies {
		req.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	e.s.srv.Handler.ServeHTTP(rec, req)
	return rec
}

// TestSSOReturnToRefusesOpenRedirects: return_to is a path on the proxy;
// every spelling a browser would take for another site is refused before
// auth is asked, and the refusal page escapes what it quotes.
func TestSSOReturnToRefusesOpenRedirects(t *testing.T) {
	e := newSSOEnv(t)
	for _, bad := range []string{
		"https://evil.example/", "//evil.example/x", "/\\evil.example", "\\\\evil.example", "/\t/evil.example",
		"/\n/evil.example", "evil.example", "javascript:alert(1)", "/a b", "/x\\y", "/" + strings.Repeat("a", maxReturnTo),
	} {
		rec := e.get("proxy.example.com:3080", ssoWebLoginPath+"?connector=corp&return_to="+url.QueryEscape(bad))
		require.Equal(t, http.StatusBadRequest, rec.Code, "%q: %s", bad, rec.Body.String())
		require.Empty(t, rec.Header().Get("Location"), bad)
		require.Contains(t, rec.Body.String(), "not valid", bad)
		require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	}
	require.Empty(t, e.sso.starts, "auth was never asked")

	// An unknown connector's name is quoted, escaped.
	e.sso.startErr = trace.NotFound("oidc_connector not found")
	rec := e.get("proxy.example.com:3080", ssoWebLoginPath+"?connector="+url.QueryEscape(`<svg>"x"`))
	require.Equal(t, http.StatusNotFound, rec.Code)
	require.NotContains(t, rec.Body.String(), "<svg>")
	require.Contains(t, rec.Body.String(), "&lt;svg&gt;&#34;x&#34;")
	e.sso.startErr = nil

	for _, good := range []struct{ in, want string }{
		{"", "/"},
		{"/web/cluster/c1/node/2b5c/alice", "/web/cluster/c1/node/2b5c/alice"},
		{"/web/recordings?t=5#x", "/web/recordings?t=5#x"},
	} {
		rec := e.get("proxy.example.com:3080", ssoWebLoginPath+"?connector=corp&return_to="+url.QueryEscape(good.in))
		require.Equal(t, http.StatusFound, rec.Code, rec.Body.String())
		require.True(t, strings.HasPrefix(rec.Header().Get("Location"), "https://idp.example/authorize?"), rec.Header().Get("Location"))
		start := e.sso.starts[len(e.sso.starts)-1]
		require.Equal(t, good.want, start.ReturnTo)
		require.Equal(t, "corp", start.Connector)
		require.Nil(t, start.Client)
		require.Equal(t, "https://proxy.example.com:3080/webapi/oidc/callback", start.RedirectURL)
	}
}

// TestSSORedirectURLFromConfiguredAddrsOnly: the redirect URI names the
// address the browser used only when it is one of the proxy's.
func TestSSORedirectURLFromConfiguredAddrsOnly(t *testing.T) {
	e := newSSOEnv(t)
	for host, want := range map[string]string{
		"proxy.example.com":     "https://proxy.example.com/webapi/oidc/callback",
		"PROXY.example.com:443": "https://proxy.example.com/webapi/oidc/callback",
		"127.0.0.1:3080":        "https://127.0.0.1:3080/webapi/oidc/callback",
		"evil.example":          "https://proxy.example.com:3080/webapi/oidc/callback",
		"proxy.example.com:9":   "https://proxy.example.com:3080/webapi/oidc/callback",
	} {
		rec := e.get(host, ssoWebLoginPath+"?connector=corp")
		require.Equal(t, http.StatusFound, rec.Code, rec.Body.String())
		require.Equal(t, want, e.sso.starts[len(e.sso.starts)-1].RedirectURL, host)
	}
}

// TestSSOBrowserLogin: the callback makes the session's secrets as a
// password login does, sets both cookies and sends the browser to its
// deep link, where the page adopts the session like a new tab.
func TestSSOBrowserLogin(t *testing.T) {
	e := newSSOEnv(t)
	deep := "/web/cluster/c1/node/2b5c/alice"
	rec := e.get("proxy.example.com", ssoWebLoginPath+"?connector=corp&return_to="+url.QueryEscape(deep))
	require.Equal(t, http.StatusFound, rec.Code)
	binding := bindingCookie(t, rec)

	rec = e.get("proxy.example.com", SSOCallbackPath+"?code=c&state=s1", binding)
	require.Equal(t, http.StatusFound, rec.Code, rec.Body.String())
	require.Equal(t, deep, rec.Header().Get("Location"))
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	require.Len(t, e.sso.callbacks, 1)
	cb := e.sso.callbacks[0]
	require.Equal(t, "code=c&state=s1", cb.Query)
	require.NotNil(t, cb.WebSession)

	var plain *http.Cookie
	var own int
	for _, c := range rec.Result().Cookies() {
		if c.Name == ssoBindingCookie {
			require.Equal(t, -1, c.MaxAge, "the binding is cleared once used")
			continue
		}
		require.True(t, c.HttpOnly && c.Secure && c.SameSite == http.SameSiteStrictMode, "%+v", c)
		if c.Name == SessionCookieName {
			plain = c
		} else if strings.HasPrefix(c.Name, SessionCookieName+"-") {
			own++
			require.Equal(t, sessionCookieFor(sessionTokenFor(c.Value)), c.Name)
		}
	}
	require.NotNil(t, plain)
	require.Equal(t, 1, own)
	require.Equal(t, cb.WebSession.Key, keyOfCookie(plain.Value), "auth stored the session whose cookie the browser got")

	// The page at the deep link adopts the session (a same-origin POST).
	req := httptest.NewRequest(http.MethodPost, "/webapi/sessions/token", nil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.AddCookie(plain)
	tok := httptest.NewRecorder()
	e.s.srv.Handler.ServeHTTP(tok, req)
	require.Equal(t, http.StatusOK, tok.Code, tok.Body.String())
	var got webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(tok.Body.Bytes(), &got))
	require.Equal(t, testUser, got.User)
	require.Equal(t, sessionTokenFor(plain.Value), got.Token)

	nodes := call(e.s, http.MethodGet, "/webapi/nodes", plain.Value, got.Token, "")
	require.Equal(t, http.StatusOK, nodes.Code, nodes.Body.String())
}

// TestSSOCallbackForPshRedirectsOnlyToLoopback: a CLI login's result goes
// to the loopback URL auth returned, and nowhere else.
func TestSSOCallbackForPshRedirectsOnlyToLoopback(t *testing.T) {
	e := newSSOEnv(t)
	sealed := []byte("sealed result bytes \x00\xff")
	for _, tc := range []struct {
		redirect string
		ok       bool
	}{
		{"http://127.0.0.1:45123/callback", true},
		{"http://[::1]:45123/callback", true},
		{"https://evil.example/callback", false},
		{"http://localhost:45123/callback", false},
		{"http://127.0.0.1.evil.example:45123/callback", false},
		{"http://user@127.0.0.1:45123/callback", false},
		{"http://127.0.0.1/callback", false},
		{"http://127.0.0.1:45123/callback?x=1", false},
		{"javascript:alert(1)", false},
	} {
		e.sso.callback = func(req authapi.SSOCallbackRequest) (*authapi.SSOCallbackResponse, error) {
			return &authapi.SSOCallbackResponse{Username: testUser, ClientRedirectURL: tc.redirect, SealedLogin: sealed}, nil
		}
		rec := e.get("proxy.example.com", SSOCallbackPath+"?code=c&state=s2")
		if !tc.ok {
			require.Equal(t, http.StatusInternalServerError, rec.Code, tc.redirect)
			require.Empty(t, rec.Header().Get("Location"), tc.redirect)
			require.NotContains(t, rec.Body.String(), "sealed", tc.redirect)
			continue
		}
		require.Equal(t, http.StatusFound, rec.Code, rec.Body.String())
		loc, err := url.Parse(rec.Header().Get("Location"))
		require.NoError(t, err)
		require.Equal(t, strings.TrimSuffix(tc.redirect, "/callback"), loc.Scheme+"://"+loc.Host)
		got, err := base64.RawURLEncoding.DecodeString(loc.Query().Get("response"))
		require.NoError(t, err)
		require.Equal(t, sealed, got)
		require.Empty(t, rec.Result().Cookies(), "a CLI login sets no browser session")
	}
}

// TestSSOCallbackErrors: failures are a page in the user's terms, the
// message escaped.
func TestSSOCallbackErrors(t *testing.T) {
	e := newSSOEnv(t)
	for _, tc := range []struct {
		err  error
		code int
		want string
	}{
		{trace.NotFound("sso state not found"), http.StatusBadRequest, "already used or has expired: start again"},
		{trace.AccessDenied(auth.MsgSSOStateGone), http.StatusBadRequest, "already used or has expired: start again"},
		{trace.AccessDenied("your identity provider account maps to no Postern role"), http.StatusForbidden, "maps to no Postern role"},
		{trace.ConnectionProblem(nil, "identity provider https://idp.example did not answer"), http.StatusServiceUnavailable, "identity provider https://idp.example did not answer"},
		{trace.BadParameter(`the identity provider said: <b>"access_denied"</b>`), http.StatusBadRequest, "&lt;b&gt;&#34;access_denied&#34;&lt;/b&gt;"},
		{trace.Errorf("backend record 17 is corrupt"), http.StatusInternalServerError, "request id"},
	} {
		e.sso.callback = func(authapi.SSOCallbackRequest) (*authapi.SSOCallbackResponse, error) { return nil, tc.err }
		rec := e.get("proxy.example.com", SSOCallbackPath+"?code=c&state=s3")
		require.Equal(t, tc.code, rec.Code, rec.Body.String())
		require.Contains(t, rec.Body.String(), tc.want)
		require.NotContains(t, rec.Body.String(), "<b>")
		require.NotContains(t, rec.Body.String(), "record 17")
		require.Empty(t, rec.Result().Cookies())
	}
	rec := e.get("proxy.example.com", SSOCallbackPath)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), "cannot be opened on its own")
}

// TestSSOPingListsConnectors: ping names the connectors, reuses the list
// for a while (ping is open to anyone), and leaves them out when auth
// cannot say.
func TestSSOPingListsConnectors(t *testing.T) {
	e := newSSOEnv(t)
	e.sso.connectors = []authapi.SSOConnectorInfo{{Name: "corp", Type: "oidc", Display: "Corp SSO"}}
	ping := func() map[string]json.RawMessage {
		rec := e.get("proxy.example.com", "/webapi/ping")
		require.Equal(t, http.StatusOK, rec.Code)
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &m))
		return m
	}
	m := ping()
	require.JSONEq(t, `[{"name":"corp","type":"oidc","display":"Corp SSO"}]`, string(m["connectors"]))
	ping()
	require.Equal(t, 1, e.sso.listCalls, "the list is reused within connectorsTTL")

	e.sso.listErr = trace.ConnectionProblem(nil, "auth down")
	e.env.clock.Advance(connectorsTTL)
	m = ping()
	require.NotContains(t, m, "connectors", "omitted when auth cannot say")
	require.Contains(t, m, "cluster_name")
	require.Equal(t, 2, e.sso.listCalls)
}

// TestSSOConsoleLogin: psh's start is checked (loopback redirect, key,
// seal key) and passed to auth as a CLI login.
func TestSSOConsoleLogin(t *testing.T) {
	e := newSSOEnv(t)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	seal := make([]byte, 32)
	body := func(mod func(*webapi.SSOConsoleLoginRequest)) string {
		req := webapi.SSOConsoleLoginRequest{Connector: "corp", PubKey: string(pub), TTLSeconds: 3600, RedirectURL: "http://127.0.0.1:40000/callback", SealKey: seal}
		if mod != nil {
			mod(&req)
		}
		data, err := json.Marshal(req)
		require.NoError(t, err)
		return string(data)
	}
	post := func(b string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, ssoConsoleLoginPth, strings.NewReader(b))
		req.Host = "127.0.0.1:3080"
		rec := httptest.NewRecorder()
		e.s.srv.Handler.ServeHTTP(rec, req)
		return rec
	}
	rec := post(body(nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var out webapi.SSOConsoleLoginResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
	require.True(t, strings.HasPrefix(out.AuthURL, "https://idp.example/"))
	start := e.sso.starts[0]
	require.Equal(t, "https://127.0.0.1:3080/webapi/oidc/callback", start.RedirectURL)
	require.NotNil(t, start.Client)
	require.Equal(t, time.Hour, start.Client.TTL)
	require.Equal(t, seal, start.Client.SealKey)
	require.Equal(t, "http://127.0.0.1:40000/callback", start.Client.RedirectURL)

	for name, mod := range map[string]func(*webapi.SSOConsoleLoginRequest){
		"remote redirect": func(r *webapi.SSOConsoleLoginRequest) { r.RedirectURL = "http://10.0.0.1:40000/callback" },
		"short seal key":  func(r *webapi.SSOConsoleLoginRequest) { r.SealKey = seal[:31] },
		"no key":          func(r *webapi.SSOConsoleLoginRequest) { r.PubKey = "" },
		"no connector":    func(r *webapi.SSOConsoleLoginRequest) { r.Connector = "" },
		"ttl":             func(r *webapi.SSOConsoleLoginRequest) { r.TTLSeconds = -1 },
	} {
		rec := post(body(mod))
		require.Equal(t, http.StatusBadRequest, rec.Code, name)
	}
	require.Len(t, e.sso.starts, 1, "refused requests never reach auth")
}

func bindingCookie(t *testing.T, rec *httptest.ResponseRecorder) *http.Cookie {
	t.Helper()
	for _, c := range rec.Result().Cookies() {
		if c.Name == ssoBindingCookie {
			require.True(t, c.HttpOnly && c.Secure && c.SameSite == http.SameSiteLaxMode && c.Path == "/", "%+v", c)
			return c
		}
	}
	t.Fatal("no binding cookie")
	return nil
}

// TestSSOBrowserLoginHandedOverIsRefused: the callback of a browser login
// that another browser started (an attacker's own login, its link sent
// to a victim: login CSRF) makes no session, with no cookie or with the
// cookie of another login; a psh login finishes whatever the browser
// holds.
func TestSSOBrowserLoginHandedOverIsRefused(t *testing.T) {
	e := newSSOEnv(t)
	rec := e.get("proxy.example.com", ssoWebLoginPath+"?connector=corp")
	require.Equal(t, http.StatusFound, rec.Code)
	other := bindingCookie(t, rec) // this browser's own login, of state s1
	other.Value = ssoBindingValue("another-state")

	for name, cookies := range map[string][]*http.Cookie{"no cookie": nil, "another login's cookie": {other}} {
		rec = e.get("proxy.example.com", SSOCallbackPath+"?code=c&state=s1", cookies...)
		require.Equal(t, http.StatusBadRequest, rec.Code, name)
		require.Contains(t, rec.Body.String(), "not started in this browser", name)
		for _, c := range rec.Result().Cookies() {
			require.NotEqual(t, SessionCookieName, c.Name, name)
		}
		cb := e.sso.callbacks[len(e.sso.callbacks)-1]
		_, err := e.env.store.Backend().Get(context.Background(), services.WebSessionKey(cb.WebSession.Key))
		require.True(t, trace.IsNotFound(err), "%s: the session auth made is dropped: %v", name, err)
	}

	e.sso.callback = func(authapi.SSOCallbackRequest) (*authapi.SSOCallbackResponse, error) {
		return &authapi.SSOCallbackResponse{Username: testUser, ClientRedirectURL: "http://127.0.0.1:4000/callback", SealedLogin: []byte("x")}, nil
	}
	rec = e.get("proxy.example.com", SSOCallbackPath+"?code=c&state=s9", other)
	require.Equal(t, http.StatusFound, rec.Code, "a psh login is not bound to a browser")
}
