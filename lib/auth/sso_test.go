package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"net/url"
	"path/filepath"
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
		Clock: clock, Logger: testLogger(), Recordings: recording.DirStorage{Dir: t.TempDir()}, Audit: audit,
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
