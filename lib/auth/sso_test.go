package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/nacl/box"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/ssotest"
)

// The proxy's callback, as the identity provider registered it.
const testSSORedirect = "https://proxy.example.test/webapi/oidc/callback"

// ssoEnv is an auth server (API included) with a real OpenID provider
// (lib/ssotest) and the connector "corp" for it: every email at
// example.com gets the role sso-dev, whose login is the email's local
// part.
type ssoEnv struct {
	*testEnv
	audit *recordingEmitter
	idp   *ssotest.Provider
	conn  *services.OIDCConnector
}

func newSSOEnv(t *testing.T) *ssoEnv {
	return newSSOEnvAt(t, time.Now().Truncate(time.Second))
}

// newSSOEnvAt is newSSOEnv with the auth server's (fake) clock at start.
func newSSOEnvAt(t *testing.T, start time.Time) *ssoEnv {
	t.Helper()
	idp, err := ssotest.Start(ssotest.Config{Dir: t.TempDir(), RedirectURLs: []string{testSSORedirect}})
	require.NoError(t, err)
	t.Cleanup(idp.Close)
	env := newSSOAuth(t, clockwork.NewFakeClockAt(start), nil)
	env.idp = idp
	env.conn = testConnector(idp)
	require.NoError(t, env.auth.UpsertOIDCConnector(context.Background(), env.conn))
	require.NoError(t, env.store.UpsertRole(context.Background(), &services.Role{
		Metadata: services.Metadata{Name: "sso-dev"},
		Spec: services.RoleSpec{
			Logins:        []string{"{{email.local(external.email)}}", "{{external.preferred_username}}"},
			NodeLabels:    map[string]services.LabelValues{"*": {"*"}},
			MaxSessionTTL: services.Duration(2 * time.Hour),
		},
	}))
	require.NoError(t, env.store.UpsertRole(context.Background(), &services.Role{
		Metadata: services.Metadata{Name: "sso-ops"},
		Spec:     services.RoleSpec{Logins: []string{"ops"}, NodeLabels: map[string]services.LabelValues{"*": {"*"}}},
	}))
	return env
}

// newSSOAuth is an auth server with its API on store (a new memory
// backend when nil) and a recording audit emitter.
func newSSOAuth(t *testing.T, clock *clockwork.FakeClock, store *services.Store) *ssoEnv {
	t.Helper()
	if store == nil {
		store = newTestStore(t, clock)
	}
	audit := &recordingEmitter{}
	adminDir := filepath.Join(t.TempDir(), "admin")
	srv, err := NewServer(ServerConfig{
		Store: store, ClusterName: testCluster, AdminIdentityDir: adminDir, BcryptCost: bcrypt.MinCost,
		Deps: observe.Deps{Clock: clock, Logger: testLogger(), Audit: audit}, Recordings: recording.DirStorage{Dir: t.TempDir()},
	})
	require.NoError(t, err)
	env := &ssoEnv{testEnv: &testEnv{clock: clock, store: store, auth: srv, adminDir: adminDir}, audit: audit}
	startAPI(t, env.testEnv)
	return env
}

func testConnector(idp *ssotest.Provider) *services.OIDCConnector {
	return &services.OIDCConnector{
		Metadata: services.Metadata{Name: "corp"},
		Spec: services.OIDCConnectorSpec{
			Display:      "Corp",
			IssuerURL:    idp.Issuer,
			CAFile:       idp.CAFile,
			ClientID:     idp.ClientID,
			ClientSecret: idp.ClientSecret,
			Scopes:       []string{"email", "profile"},
			ClaimsToRoles: []services.ClaimMapping{
				{Claim: "email", Value: "*@example.com", Roles: []string{"sso-dev"}},
			},
		},
	}
}

// webSession is what a proxy sends for a browser login.
func webSession() *authapi.WebSessionInit {
	var id [16]byte
	_, _ = rand.Read(id[:])
	key := sha256.Sum256(id[:])
	tok := sha256.Sum256([]byte("token"))
	return &authapi.WebSessionInit{Key: hexString(key[:]), TokenHash: tok[:]}
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// start begins a browser login and returns the provider's callback query
// after alice (or user) logged in at the provider.
func (e *ssoEnv) start(t *testing.T, req authapi.SSOAuthRequest, user string) string {
	t.Helper()
	ctx := context.Background()
	if req.Connector == "" {
		req.Connector = "corp"
	}
	if req.RedirectURL == "" {
		req.RedirectURL = testSSORedirect
	}
	resp, err := e.auth.CreateSSOAuthRequest(ctx, req)
	require.NoError(t, err)
	q, err := e.idp.Login(ctx, resp.AuthURL, user, "verysecure")
	require.NoError(t, err)
	return q
}

func (e *ssoEnv) finish(query string) (*authapi.SSOCallbackResponse, error) {
	return e.auth.ValidateSSOCallback(context.Background(), authapi.SSOCallbackRequest{Query: query, WebSession: webSession(), RemoteAddr: "198.51.100.7:5555"})
}

// lastEvent returns the last audit event of typ.
func (r *recordingEmitter) last(typ string) (events.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.all) - 1; i >= 0; i-- {
		if r.all[i].Type == typ {
			return r.all[i], true
		}
	}
	return events.Event{}, false
}

// requireFailedAudit asserts the last auth.failed is an oidc refusal
// whose reason contains want.
func (e *ssoEnv) requireFailedAudit(t *testing.T, want string) events.Event {
	t.Helper()
	ev, ok := e.audit.last(events.AuthFailed)
	require.True(t, ok, "no auth.failed event")
	require.Equal(t, "oidc", ev.Fields[events.FieldMethod])
	require.Contains(t, ev.Fields[events.FieldReason], want)
	return ev
}

// TestSSOBrowserLogin is the whole browser login against a real
// provider: the certificate carries the mapped role and the login
// expanded from the provider's email claim, the user record is created
// with its connector marker, and a second login rewrites its roles.
func TestSSOBrowserLogin(t *testing.T) {
	e := newSSOEnv(t)
	ctx := context.Background()

	infos, err := e.auth.GetSSOConnectors(ctx)
	require.NoError(t, err)
	require.Equal(t, []authapi.SSOConnectorInfo{{Name: "corp", Type: "oidc", Display: "Corp"}}, infos)

	resp, err := e.auth.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{Connector: "corp", RedirectURL: testSSORedirect, ReturnTo: "/web/cluster/example.test/nodes"})
	require.NoError(t, err)
	au, err := url.Parse(resp.AuthURL)
	require.NoError(t, err)
	q := au.Query()
	require.Equal(t, "S256", q.Get("code_challenge_method"))
	require.NotEmpty(t, q.Get("code_challenge"))
	require.NotEmpty(t, q.Get("nonce"))
	require.NotEmpty(t, q.Get("state"))
	require.Equal(t, testSSORedirect, q.Get("redirect_uri"))
	require.Contains(t, q.Get("scope"), "openid")

	cb, err := e.idp.Login(ctx, resp.AuthURL, "alice", "verysecure")
	require.NoError(t, err)
	ws := webSession()
	out, err := e.auth.ValidateSSOCallback(ctx, authapi.SSOCallbackRequest{Query: cb, WebSession: ws, RemoteAddr: "198.51.100.7:5555"})
	require.NoError(t, err)
	require.Equal(t, "alice@example.com", out.Username)
	require.Equal(t, "/web/cluster/example.test/nodes", out.ReturnTo)
	require.Empty(t, out.SealedLogin)

	u, err := e.store.GetUser(ctx, "alice@example.com")
	require.NoError(t, err)
	require.Equal(t, "sso:corp", u.Connector)
	require.Empty(t, u.PasswordHash)
	require.Equal(t, []string{"sso-dev"}, u.Roles)
	require.Equal(t, []string{"alice@example.com"}, u.Traits["external.email"])
	// The web session exists, with the role's TTL.
	sess, err := e.store.GetWebSession(ctx, ws.Key)
	require.NoError(t, err)
	require.Equal(t, "alice@example.com", sess.User)
	require.Equal(t, e.clock.Now().Add(2*time.Hour).Unix(), sess.Expires.Unix())

	ev, ok := e.audit.last(events.AuthLogin)
	require.True(t, ok)
	require.Equal(t, "alice@example.com", ev.User)
	require.Equal(t, "oidc", ev.Fields[events.FieldMethod])
	require.Equal(t, "corp", ev.Fields[events.FieldConnector])

	// The mapping changes: the next login rewrites the roles.
	e.conn.Spec.ClaimsToRoles = append(e.conn.Spec.ClaimsToRoles, services.ClaimMapping{Claim: "preferred_username", Value: "ali*", Roles: []string{"sso-ops"}})
	require.NoError(t, e.auth.UpsertOIDCConnector(ctx, e.conn))
	cert := e.cliLogin(t, "alice")
	require.ElementsMatch(t, []string{"alice", "ops"}, cert.ValidPrincipals)
	var roles []string
	require.NoError(t, json.Unmarshal([]byte(cert.Extensions[services.CertExtensionRoles]), &roles))
	require.Equal(t, []string{"sso-dev", "sso-ops"}, roles)
	u, err = e.store.GetUser(ctx, "alice@example.com")
	require.NoError(t, err)
	require.Equal(t, []string{"sso-dev", "sso-ops"}, u.Roles)
}

// cliLogin runs a psh login for user through the auth API as the proxy
// would, opens the sealed result with psh's key and returns the
// certificate.
func (e *ssoEnv) cliLogin(t *testing.T, user string) *ssh.Certificate {
	t.Helper()
	ctx := context.Background()
	proxy := e.client(t, e.identity(t, "proxy-1", RoleProxy))
	sealPub, sealPriv, err := box.GenerateKey(rand.Reader)
	require.NoError(t, err)
	userPub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sshPub, err := ssh.NewPublicKey(userPub)
	require.NoError(t, err)
	resp, err := proxy.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{
		Connector: "corp", RedirectURL: testSSORedirect,
		Client: &authapi.SSOClientLogin{PublicKey: ssh.MarshalAuthorizedKey(sshPub), TTL: time.Hour, RedirectURL: "http://127.0.0.1:43210/callback", SealKey: sealPub[:]},
	})
	require.NoError(t, err)
	cb, err := e.idp.Login(ctx, resp.AuthURL, user, "verysecure")
	require.NoError(t, err)
	out, err := proxy.ValidateSSOCallback(ctx, authapi.SSOCallbackRequest{Query: cb, RemoteAddr: "198.51.100.7:5555"})
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:43210/callback", out.ClientRedirectURL)
	require.Empty(t, out.ReturnTo)

	// Another key cannot open it.
	otherPub, otherPriv, err := box.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, ok := box.OpenAnonymous(nil, out.SealedLogin, otherPub, otherPriv)
	require.False(t, ok, "the sealed login opened with another key")

	plain, ok := box.OpenAnonymous(nil, out.SealedLogin, sealPub, sealPriv)
	require.True(t, ok, "the sealed login does not open with psh's key")
	var login authapi.SSHLoginResponse
	require.NoError(t, json.Unmarshal(plain, &login))
	require.Equal(t, out.Username, login.Username)
	require.NotEmpty(t, login.HostSigners)
	pub, _, _, _, err := ssh.ParseAuthorizedKey(login.Cert)
	require.NoError(t, err)
	cert := pub.(*ssh.Certificate)
	require.Equal(t, string(sshPub.Marshal()), string(cert.Key.Marshal()))
	require.Equal(t, uint64(e.clock.Now().Add(time.Hour).Unix()), cert.ValidBefore)
	return cert
}

// TestSSOCLILoginSealed: psh's login comes back sealed to psh's key (only
// that key opens it), and the request is refused at once for a seal key
// of the wrong length or a redirect that is not psh's loopback listener.
func TestSSOCLILoginSealed(t *testing.T) {
	e := newSSOEnv(t)
	cert := e.cliLogin(t, "alice")
	require.Equal(t, []string{"alice"}, cert.ValidPrincipals)
	require.Equal(t, "alice@example.com", cert.KeyId)

	ctx := context.Background()
	userPub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sshPub, err := ssh.NewPublicKey(userPub)
	require.NoError(t, err)
	good := authapi.SSOClientLogin{PublicKey: ssh.MarshalAuthorizedKey(sshPub), RedirectURL: "http://127.0.0.1:1234/cb", SealKey: make([]byte, 32)}
	for name, tc := range map[string]func(c *authapi.SSOClientLogin){
		"short seal key":  func(c *authapi.SSOClientLogin) { c.SealKey = make([]byte, 31) },
		"long seal key":   func(c *authapi.SSOClientLogin) { c.SealKey = make([]byte, 33) },
		"remote redirect": func(c *authapi.SSOClientLogin) { c.RedirectURL = "http://evil.example:1234/cb" },
		"https redirect":  func(c *authapi.SSOClientLogin) { c.RedirectURL = "https://127.0.0.1:1234/cb" },
		"no port":         func(c *authapi.SSOClientLogin) { c.RedirectURL = "http://127.0.0.1/cb" },
		"userinfo trick":  func(c *authapi.SSOClientLogin) { c.RedirectURL = "http://127.0.0.1:80@evil.example:1234/cb" },
		"no key":          func(c *authapi.SSOClientLogin) { c.PublicKey = nil },
	} {
		cl := good
		tc(&cl)
		_, err := e.auth.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{Connector: "corp", RedirectURL: testSSORedirect, Client: &cl})
		require.True(t, trace.IsBadParameter(err), "%s: %v", name, err)
	}
	for _, ok := range []string{"http://127.0.0.1:1/cb", "http://[::1]:65535/x?y=1", "http://localhost:8080/"} {
		cl := good
		cl.RedirectURL = ok
		_, err := e.auth.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{Connector: "corp", RedirectURL: testSSORedirect, Client: &cl})
		require.NoError(t, err, ok)
	}
}

// stateItem returns the stored record of the state in query.
func (e *ssoEnv) stateItem(t *testing.T, query string) (*backend.Item, ssoState) {
	t.Helper()
	q, err := url.ParseQuery(query)
	require.NoError(t, err)
	item, err := e.store.Backend().Get(context.Background(), ssoStateKey(q.Get("state")))
	require.NoError(t, err)
	var st ssoState
	require.NoError(t, json.Unmarshal(item.Value, &st))
	return item, st
}

// TestSSOReplayedCallback: a state is good for one callback; the second
// (the same callback URL replayed, from history or a log) is refused
// and audited.
func TestSSOReplayedCallback(t *testing.T) {
	e := newSSOEnv(t)
	cb := e.start(t, authapi.SSOAuthRequest{}, "alice")
	_, err := e.finish(cb)
	require.NoError(t, err)
	_, err = e.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, "already used")
	e.requireFailedAudit(t, "already used")
}

// TestSSOSwappedState: the code of one login presented with the state of
// another (login CSRF, or a code stolen from another browser) fails: the
// code was bound to the other login's PKCE challenge, and the token to
// its nonce.
func TestSSOSwappedState(t *testing.T) {
	e := newSSOEnv(t)
	a := e.start(t, authapi.SSOAuthRequest{}, "alice")
	b := e.start(t, authapi.SSOAuthRequest{}, "mallory")
	qa, err := url.ParseQuery(a)
	require.NoError(t, err)
	qb, err := url.ParseQuery(b)
	require.NoError(t, err)
	swapped := url.Values{"state": {qb.Get("state")}, "code": {qa.Get("code")}}.Encode()
	_, err = e.finish(swapped)
	requireKind(t, err, trace.IsAccessDenied, "refused the authorization code")
	e.requireFailedAudit(t, "authorization code")
	// The state it spent is gone; so nobody logged in.
	_, err = e.finish(b)
	requireKind(t, err, trace.IsAccessDenied, "already used")
	_, err = e.store.GetUser(context.Background(), "alice@example.com")
	require.True(t, trace.IsNotFound(err))
}

// TestSSONonceMismatch: an ID token whose nonce is not the login's is
// refused (the stored nonce is edited to stand for a token minted for
// another login).
func TestSSONonceMismatch(t *testing.T) {
	e := newSSOEnv(t)
	cb := e.start(t, authapi.SSOAuthRequest{}, "alice")
	item, st := e.stateItem(t, cb)
	st.Nonce = "another-login"
	item.Value, _ = json.Marshal(st)
	_, err := e.store.Backend().Put(context.Background(), *item)
	require.NoError(t, err)
	_, err = e.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, "nonce does not match")
	e.requireFailedAudit(t, "nonce")
}

// authNonce is the nonce of a login started with req.
func (e *ssoEnv) startWithNonce(t *testing.T) (authURL, nonce string) {
	t.Helper()
	resp, err := e.auth.CreateSSOAuthRequest(context.Background(), authapi.SSOAuthRequest{Connector: "corp", RedirectURL: testSSORedirect})
	require.NoError(t, err)
	u, err := url.Parse(resp.AuthURL)
	require.NoError(t, err)
	return resp.AuthURL, u.Query().Get("nonce")
}

// TestSSOTokenFromAnotherProvider: a genuine token of a second provider
// that registered the same client_id (with the right nonce, even) is
// refused: it names another issuer and is signed by keys that are not
// the connector's provider's.
func TestSSOTokenFromAnotherProvider(t *testing.T) {
	e := newSSOEnv(t)
	ctx := context.Background()
	other, err := ssotest.Start(ssotest.Config{Dir: t.TempDir(), RedirectURLs: []string{testSSORedirect}, ClientID: e.idp.ClientID, ClientSecret: e.idp.ClientSecret})
	require.NoError(t, err)
	t.Cleanup(other.Close)

	authURL, nonce := e.startWithNonce(t)
	foreign, err := other.IDToken(ctx, "alice", "verysecure", nonce)
	require.NoError(t, err)
	e.idp.RewriteIDTokens(func(string) string { return foreign })
	cb, err := e.idp.Login(ctx, authURL, "alice", "verysecure")
	require.NoError(t, err)
	_, err = e.finish(cb)
	// go-oidc checks the signature (against the connector's provider's
	// JWKS) before the issuer: this one fails there.
	requireKind(t, err, trace.IsAccessDenied, "ID token is not valid")
	require.Contains(t, err.Error(), "signature")
	e.requireFailedAudit(t, "ID token is not valid")
}

// TestSSOUnsignedToken: the provider's own token with its signature
// stripped and alg "none" is refused, and the refusal reaches the caller
// and the audit log.
func TestSSOUnsignedToken(t *testing.T) {
	e := newSSOEnv(t)
	e.idp.RewriteIDTokens(func(tok string) string {
		parts := strings.Split(tok, ".")
		header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
		return header + "." + parts[1] + "."
	})
	cb := e.start(t, authapi.SSOAuthRequest{}, "alice")
	_, err := e.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, "ID token is not valid")
	e.requireFailedAudit(t, "ID token is not valid")

	// Signed, but with the claims changed (another user): the signature
	// no longer matches.
	e.idp.RewriteIDTokens(func(tok string) string {
		parts := strings.Split(tok, ".")
		claims, _ := base64.RawURLEncoding.DecodeString(parts[1])
		var m map[string]any
		_ = json.Unmarshal(claims, &m)
		m["sub"] = "id2"
		claims, _ = json.Marshal(m)
		return parts[0] + "." + base64.RawURLEncoding.EncodeToString(claims) + "." + parts[2]
	})
	cb = e.start(t, authapi.SSOAuthRequest{}, "alice")
	_, err = e.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, "ID token is not valid")
}

// TestSSOExpiredToken: a token checked after its expiry by this auth
// server's clock is refused. The provider's tokens live an hour and a
// login's state ten minutes, so the state is kept alive by hand (as
// though the login were slow) while the clock passes the token's expiry.
func TestSSOExpiredToken(t *testing.T) {
	e := newSSOEnv(t)
	cb := e.start(t, authapi.SSOAuthRequest{}, "alice")
	item, _ := e.stateItem(t, cb)
	e.clock.Advance(2 * time.Hour)
	item.Expires = e.clock.Now().Add(time.Minute)
	_, err := e.store.Backend().Put(context.Background(), *item)
	require.NoError(t, err)
	_, err = e.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, "expired")
	e.requireFailedAudit(t, "expired")
}

// TestSSOClockSkew: an auth server whose clock is an hour behind the
// provider's sees a token issued in its future, and refuses it rather
// than trust expiry checks on clocks that disagree.
func TestSSOClockSkew(t *testing.T) {
	e := newSSOEnvAt(t, time.Now().Add(-time.Hour).Truncate(time.Second))
	cb := e.start(t, authapi.SSOAuthRequest{}, "alice")
	_, err := e.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, "in the future")
	e.requireFailedAudit(t, "clocks disagree")
}

// TestSSOOpenRedirect: return_to is a local path or the login does not
// start; a state whose return_to was tampered with in the backend does
// not send the browser away either.
func TestSSOOpenRedirect(t *testing.T) {
	e := newSSOEnv(t)
	ctx := context.Background()
	for _, bad := range []string{"//evil.example/", "/\\evil.example", "https://evil.example/", "evil.example", "/\t/evil.example", "javascript:alert(1)", "/ok\r\nLocation: https://evil"} {
		_, err := e.auth.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{Connector: "corp", RedirectURL: testSSORedirect, ReturnTo: bad})
		require.True(t, trace.IsBadParameter(err), "%q: %v", bad, err)
	}
	_, err := e.auth.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{Connector: "corp", RedirectURL: "http://proxy.example.test/cb"})
	require.True(t, trace.IsBadParameter(err), "plain http proxy callback: %v", err)

	cb := e.start(t, authapi.SSOAuthRequest{ReturnTo: "/web"}, "alice")
	item, st := e.stateItem(t, cb)
	st.ReturnTo = "//evil.example"
	item.Value, _ = json.Marshal(st)
	_, err = e.store.Backend().Put(ctx, *item)
	require.NoError(t, err)
	out, err := e.finish(cb)
	require.Error(t, err, "answered %+v", out)
	require.True(t, trace.IsBadParameter(err), "%v", err)
}

// TestSSONoRole: an account whose claims match no mapping is refused with
// exactly MsgNoRole, and the audit event shows the claims the mapping
// looked at (and nothing else of the profile); no user record is made.
func TestSSONoRole(t *testing.T) {
	e := newSSOEnv(t)
	cb := e.start(t, authapi.SSOAuthRequest{}, "mallory")
	_, err := e.finish(cb)
	require.True(t, trace.IsAccessDenied(err), "%v", err)
	require.Equal(t, "your identity provider account maps to no Postern role", trace.UserMessage(err))
	ev := e.requireFailedAudit(t, "claims map to no role")
	require.Equal(t, "mallory@elsewhere.test", ev.User)
	require.Equal(t, "corp", ev.Fields[events.FieldConnector])
	require.Equal(t, map[string][]string{"email": {"mallory@elsewhere.test"}}, ev.Fields[events.FieldClaims])
	_, err = e.store.GetUser(context.Background(), "mallory@elsewhere.test")
	require.True(t, trace.IsNotFound(err))
}

// TestSSODeletedConnector: removing the connector refuses new logins and
// the one under way.
func TestSSODeletedConnector(t *testing.T) {
	e := newSSOEnv(t)
	ctx := context.Background()
	cb := e.start(t, authapi.SSOAuthRequest{}, "alice")
	require.NoError(t, e.adminClient(t).DeleteOIDCConnector(ctx, "corp"))
	_, err := e.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, `SSO connector "corp" was removed`)
	e.requireFailedAudit(t, "was removed")
	_, err = e.auth.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{Connector: "corp", RedirectURL: testSSORedirect})
	requireKind(t, err, trace.IsNotFound, `unknown SSO connector "corp"`)
	infos, err := e.auth.GetSSOConnectors(ctx)
	require.NoError(t, err)
	require.Empty(t, infos)
}

// TestSSOAcrossAuthServers: a login started on one auth server finishes
// on another that shares the backend (the state is there, not in
// memory), and only once.
func TestSSOAcrossAuthServers(t *testing.T) {
	a := newSSOEnv(t)
	b := newSSOAuth(t, a.clock, a.store)
	cb := a.start(t, authapi.SSOAuthRequest{ReturnTo: "/web/nodes"}, "alice")
	out, err := b.auth.ValidateSSOCallback(context.Background(), authapi.SSOCallbackRequest{Query: cb, WebSession: webSession()})
	require.NoError(t, err)
	require.Equal(t, "alice@example.com", out.Username)
	require.Equal(t, "/web/nodes", out.ReturnTo)
	_, err = a.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, "already used")
}

// TestSSORefusals: the provider's own refusal is named; a local user is
// not taken over; an unreachable provider is named; connectors without a
// secret are refused; pctl's reads never see the secret.
func TestSSORefusals(t *testing.T) {
	e := newSSOEnv(t)
	ctx := context.Background()

	resp, err := e.auth.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{Connector: "corp", RedirectURL: testSSORedirect})
	require.NoError(t, err)
	u, err := url.Parse(resp.AuthURL)
	require.NoError(t, err)
	q := url.Values{"state": {u.Query().Get("state")}, "error": {"access_denied"}, "error_description": {"the user said no\x1b[31m"}}
	_, err = e.finish(q.Encode())
	requireKind(t, err, trace.IsAccessDenied, "the identity provider refused the login: access_denied: the user said no")
	require.NotContains(t, err.Error(), "\x1b")
	e.requireFailedAudit(t, "access_denied")

	// A local user of the same name is not taken over.
	_, err = e.auth.CreateUser(ctx, "alice@example.com", []byte("password1"), []string{"root"}, []string{"admin"}, false)
	require.NoError(t, err)
	_, err = e.finish(e.start(t, authapi.SSOAuthRequest{}, "alice"))
	requireKind(t, err, trace.IsAccessDenied, "already exists as a local user")
	usr, err := e.store.GetUser(ctx, "alice@example.com")
	require.NoError(t, err)
	require.Equal(t, []string{"admin"}, usr.Roles)
	require.Empty(t, usr.Connector)

	// An unreachable provider.
	l, err := netListen()
	require.NoError(t, err)
	dead := "https://" + l.Addr().String() + "/"
	require.NoError(t, l.Close())
	down := testConnector(e.idp)
	down.Metadata.Name = "down"
	down.Spec.IssuerURL = dead
	require.NoError(t, e.auth.UpsertOIDCConnector(ctx, down))
	_, err = e.auth.CreateSSOAuthRequest(ctx, authapi.SSOAuthRequest{Connector: "down", RedirectURL: testSSORedirect})
	requireKind(t, err, trace.IsConnectionProblem, "identity provider "+dead+" did not answer")

	// The secret: required, kept when written back without it, never read back.
	admin := e.adminClient(t)
	nosecret := testConnector(e.idp)
	nosecret.Metadata.Name = "nosecret"
	nosecret.Spec.ClientSecret = ""
	requireKind(t, admin.UpsertOIDCConnector(ctx, nosecret), trace.IsBadParameter, "client_secret")
	cs, err := admin.GetOIDCConnectors(ctx)
	require.NoError(t, err)
	require.Len(t, cs, 2)
	for _, c := range cs {
		require.Empty(t, c.Spec.ClientSecret)
	}
	back := cs[0]
	require.Equal(t, "corp", back.Metadata.Name)
	require.NoError(t, admin.UpsertOIDCConnector(ctx, &back))
	stored, err := e.store.GetOIDCConnector(ctx, "corp")
	require.NoError(t, err)
	require.Equal(t, e.idp.ClientSecret, stored.Spec.ClientSecret)

	// Garbage callbacks.
	for _, bad := range []string{"", "code=x", "state=a&state=b&code=c", "state=x&code=y"} {
		_, err := e.finish(bad)
		require.Error(t, err, bad)
	}
}

// TestSSOKeyRotation: the provider rotates its signing key. A token signed
// by the new key verifies at once (the key set is fetched again for a key
// it does not know); a token signed by a key the provider has withdrawn
// stops verifying once the cached provider is older than its maximum age,
// instead of being trusted for as long as this auth server runs.
func TestSSOKeyRotation(t *testing.T) {
	e := newSSOEnv(t)
	ctx := context.Background()
	e.auth.sso.maxAge = time.Minute

	_, err := e.finish(e.start(t, authapi.SSOAuthRequest{}, "alice"))
	require.NoError(t, err, "the first key")
	_, err = e.finish(e.start(t, authapi.SSOAuthRequest{}, "alice"))
	require.NoError(t, err)
	require.Equal(t, 1, e.idp.KeyFetches(), "the keys are cached: one fetch for two logins")

	require.NoError(t, e.idp.RotateKey(false))
	_, err = e.finish(e.start(t, authapi.SSOAuthRequest{}, "alice"))
	require.NoError(t, err, "a new key is picked up at the first token it signs")
	require.Equal(t, 2, e.idp.KeyFetches())

	// Two logins whose tokens the current key signs; then the provider
	// withdraws that key.
	url1, nonce1 := e.startWithNonce(t)
	tok1, err := e.idp.IDToken(ctx, "alice", "verysecure", nonce1)
	require.NoError(t, err)
	url2, nonce2 := e.startWithNonce(t)
	tok2, err := e.idp.IDToken(ctx, "alice", "verysecure", nonce2)
	require.NoError(t, err)
	require.NoError(t, e.idp.RotateKey(false))

	// Within the maximum age the cached keys still hold the withdrawn
	// one: that is the bound, and it is what this test pins down.
	e.idp.RewriteIDTokens(func(string) string { return tok1 })
	cb, err := e.idp.Login(ctx, url1, "alice", "verysecure")
	require.NoError(t, err)
	_, err = e.finish(cb)
	require.NoError(t, err)

	// Past it, the provider's keys are fetched again, and the withdrawn
	// key is no longer among them.
	e.clock.Advance(time.Minute + time.Second)
	e.idp.RewriteIDTokens(func(string) string { return tok2 })
	cb, err = e.idp.Login(ctx, url2, "alice", "verysecure")
	require.NoError(t, err)
	_, err = e.finish(cb)
	requireKind(t, err, trace.IsAccessDenied, "ID token is not valid")
	require.Contains(t, err.Error(), "signature")
	e.requireFailedAudit(t, "ID token is not valid")

	// And the current key still works after the refresh.
	e.idp.RewriteIDTokens(nil)
	_, err = e.finish(e.start(t, authapi.SSOAuthRequest{}, "alice"))
	require.NoError(t, err)
}
