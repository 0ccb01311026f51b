package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// roleNone is the caller without a client certificate in wantPolicy.
const roleNone = "none"

// wantPolicy is the auth API's authorization policy, written down a second
// time, independently of registerRoutes: every registered endpoint must
// have a row (a new endpoint without one fails TestAPIRolePolicy), and
// each row says exactly which callers may reach the handler.
var wantPolicy = map[string][]string{
	"POST /v1/join":                 {roleNone},
	"GET /v1/join-relay":            {RoleProxy},
	"POST /v1/join/trusted_cluster": {roleNone},

	"PUT /v1/trustedclusters":                 {RoleAdmin},
	"GET /v1/trustedclusters":                 {RoleNode, RoleProxy, RoleAdmin},
	"DELETE /v1/trustedclusters/{name}":       {RoleAdmin},
	"GET /v1/remoteclusters":                  {RoleProxy, RoleAdmin},
	"POST /v1/certs/leaf":                     {RoleProxy},
	"PUT /v1/remoteclusters/{name}/heartbeat": {RoleProxy},
	"DELETE /v1/remoteclusters/{name}":        {RoleAdmin},

	"GET /v1/ping": {RoleNode, RoleProxy, RoleAdmin},

	"POST /v1/access_requests":        {RoleProxy},
	"POST /v1/access_requests/list":   {RoleProxy, RoleAdmin},
	"POST /v1/access_requests/get":    {RoleProxy, RoleAdmin},
	"POST /v1/access_requests/review": {RoleProxy, RoleAdmin},
	"POST /v1/access_requests/cert":   {RoleProxy},

	"PUT /v1/nodes":                                {RoleNode, RoleProxy, RoleAdmin},
	"GET /v1/nodes":                                {RoleProxy, RoleAdmin},
	"DELETE /v1/nodes/{cluster}/{uuid}":            {RoleAdmin},
	"POST /v1/nodes/openssh":                       {RoleAdmin},
	"POST /v1/nodes/openssh/{name}/rotate":         {RoleAdmin},
	"POST /v1/nodes/openssh/{uuid}/root-user-cert": {RoleProxy},
	"GET /v1/watch/nodes":                          {RoleProxy, RoleAdmin},

	"POST /v1/tunnel_connections":        {RoleProxy},
	"POST /v1/tunnel_connections/delete": {RoleProxy},
	"GET /v1/tunnel_connections":         {RoleProxy, RoleAdmin},
	"GET /v1/watch/tunnel_connections":   {RoleProxy},
	"PUT /v1/proxies":                    {RoleProxy},
	"DELETE /v1/proxies/self":            {RoleProxy},
	"GET /v1/proxies":                    {RoleProxy, RoleAdmin},

	"GET /v1/authorities/{type}":           {RoleNode, RoleProxy, RoleAdmin},
	"GET /v1/authorities/{type}/{cluster}": {RoleNode, RoleProxy, RoleAdmin},

	"GET /v1/roles":           {RoleNode, RoleProxy, RoleAdmin},
	"GET /v1/roles/{name}":    {RoleNode, RoleProxy, RoleAdmin},
	"PUT /v1/roles":           {RoleAdmin},
	"DELETE /v1/roles/{name}": {RoleAdmin},

	"GET /v1/networking":       {RoleNode, RoleProxy, RoleAdmin},
	"GET /v1/watch/networking": {RoleNode, RoleProxy},
	"PUT /v1/networking":       {RoleAdmin},

	"GET /v1/users":                   {RoleAdmin},
	"POST /v1/users":                  {RoleAdmin},
	"DELETE /v1/users/{name}":         {RoleAdmin},
	"DELETE /v1/users/{name}/lockout": {RoleAdmin},
	"DELETE /v1/users/{name}/mfa":     {RoleAdmin},
	"GET /v1/auth_preference":         {RoleProxy, RoleAdmin},
	"PUT /v1/auth_preference":         {RoleAdmin},
	"DELETE /v1/auth_preference":      {RoleAdmin},
	"PUT /v1/users/{name}":            {RoleAdmin},
	"PUT /v1/users/{name}/password":   {RoleAdmin},
	"GET /v1/tokens":                  {RoleAdmin},
	"POST /v1/tokens":                 {RoleAdmin},
	"DELETE /v1/tokens/{name}":        {RoleAdmin},

	"POST /v1/certs/user": {RoleAdmin},
	"POST /v1/login":      {RoleProxy},
	"POST /v1/login/ssh":  {RoleProxy},

	"GET /v1/second-factor":        {RoleProxy},
	"POST /v1/mfa/login/begin":     {RoleProxy},
	"POST /v1/mfa/login/finish":    {RoleProxy},
	"POST /v1/mfa/register/begin":  {RoleProxy},
	"POST /v1/mfa/register/finish": {RoleProxy},
	"POST /v1/mfa/devices/list":    {RoleProxy},
	"POST /v1/mfa/devices/rename":  {RoleProxy},
	"POST /v1/mfa/devices/delete":  {RoleProxy},

	"POST /v1/sso/requests":             {RoleProxy},
	"POST /v1/sso/callback":             {RoleProxy},
	"GET /v1/sso/connectors":            {RoleProxy},
	"POST /v1/cli-logins":               {RoleProxy},
	"POST /v1/cli-logins/finish":        {RoleProxy},
	"POST /v1/cli-logins/session":       {RoleProxy},
	"POST /v1/mfa/session/begin":        {RoleProxy},
	"POST /v1/mfa/session/certs":        {RoleProxy},
	"PUT /v1/oidc_connectors":           {RoleAdmin},
	"GET /v1/oidc_connectors":           {RoleAdmin},
	"DELETE /v1/oidc_connectors/{name}": {RoleAdmin},

	"POST /v1/websessions/get":         {RoleProxy},
	"POST /v1/websessions/touch":       {RoleProxy},
	"POST /v1/websessions/delete":      {RoleProxy},
	"POST /v1/websessions/certs":       {RoleProxy},
	"GET /v1/watch/websessions/ended":  {RoleProxy},
	"GET /v1/websessions/{key}":        {},
	"POST /v1/websessions/{key}/touch": {},
	"DELETE /v1/websessions/{key}":     {},
	"GET /v1/watch/websessions":        {},

	"GET /v1/events":  {RoleAdmin},
	"POST /v1/events": {RoleNode, RoleProxy},

	"PUT /v1/locks":                  {RoleAdmin},
	"DELETE /v1/locks/{kind}/{name}": {RoleAdmin},
	"GET /v1/locks":                  {RoleNode, RoleProxy, RoleAdmin},
	"GET /v1/watch/locks":            {RoleNode, RoleProxy},
	"GET /v1/watch/access":           {RoleNode, RoleProxy},

	"PUT /v1/recordings/{session}/chunks/{n}": {RoleNode, RoleProxy},
	"GET /v1/recordings":                      {RoleProxy, RoleAdmin},
	"GET /v1/recordings/{session}":            {RoleProxy, RoleAdmin},
	"GET /v1/recordings/{session}/last":       {RoleNode, RoleProxy},

	"GET /v1/backup": {RoleAdmin},
}

var pathParamRe = regexp.MustCompile(`\{[a-z]+\}`)

// policyCaller is one kind of caller: a real mTLS client holding an
// identity of a role, or a TLS client without any certificate.
type policyCaller struct {
	role string
	tls  *tls.Config
}

// callEndpoint sends one request for pattern (path parameters filled with
// "x", a JSON body of {} for writes) over cfg, to serverName. It returns
// the status and body, or the transport error (a refused handshake).
func callEndpoint(t *testing.T, env *testEnv, cfg *tls.Config, serverName, pattern string) (int, string, error) {
	t.Helper()
	method, path, ok := strings.Cut(pattern, " ")
	require.True(t, ok, pattern)
	path = pathParamRe.ReplaceAllString(path, "x")
	cfg = cfg.Clone()
	cfg.ServerName = serverName
	cfg.Time = env.clock.Now
	tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	var body io.Reader
	if method == http.MethodPost || method == http.MethodPut {
		body = strings.NewReader("{}")
	}
	// A watch answers 200 at once and then streams: the headers are the
	// answer; the context ends the stream.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "https://"+env.addr+path, body)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "application/x-ndjson" {
		return resp.StatusCode, "", nil
	}
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), nil
}

// roleDenied reports whether an answer is the role check's refusal (and
// not a handler's own 403, such as "may not announce node").
func roleDenied(status int, body string) bool {
	if status != http.StatusForbidden {
		return false
	}
	var we authapi.ErrorResponse
	return json.Unmarshal([]byte(body), &we) == nil && we.Error.Kind == authapi.KindAccessDenied && strings.Contains(we.Error.Message, "may not call")
}

// unrouted reports whether an answer is the mux's own 404 (no such
// endpoint on this listener) rather than a handler's NotFound, which is
// JSON.
func unrouted(status int, body string) bool {
	var we authapi.ErrorResponse
	return status == http.StatusNotFound && json.Unmarshal([]byte(body), &we) != nil
}

// TestAPIRolePolicy walks every endpoint the API server registered, with
// real mTLS clients holding admin, proxy, node and auth identities and a
// client without a certificate, and checks each is allowed exactly where
// wantPolicy says and refused (403, or no handshake) everywhere else.
func TestAPIRolePolicy(t *testing.T) {
	env := newTestAPI(t)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.auth.TLSCACertPEM())
	admin, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	callers := []policyCaller{
		{RoleAdmin, admin.ClientTLSConfig()},
		{RoleProxy, env.identity(t, "proxy-1", RoleProxy).ClientTLSConfig()},
		{RoleNode, env.identity(t, "node-1", RoleNode).ClientTLSConfig()},
		// The auth server's own identity calls nothing: it gets nothing.
		{RoleAuth, env.identity(t, "auth-1", RoleAuth).ClientTLSConfig()},
		{roleNone, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}

	var registered []string
	for _, r := range env.api.routes {
		registered = append(registered, r.pattern)
		if r.roles == nil {
			continue
		}
		// The registered roles are the table's, in the same order.
		require.Equal(t, wantPolicy[r.pattern], r.roles, "roles registered for %s", r.pattern)
	}
	var want []string
	for p := range wantPolicy {
		want = append(want, p)
	}
	slices.Sort(registered)
	slices.Sort(want)
	require.Equal(t, want, registered, "every registered endpoint needs a row in wantPolicy, and every row an endpoint")

	for _, pattern := range registered {
		allowed := wantPolicy[pattern]
		// The join listener's endpoints take no client certificate.
		isJoin := slices.Contains(allowed, roleNone)
		for _, c := range callers {
			mayCall := slices.Contains(allowed, c.role)
			t.Run(pattern+" as "+c.role, func(t *testing.T) {
				status, body, err := callEndpoint(t, env, c.tls, AuthServerName, pattern)
				switch {
				case c.role == roleNone:
					// Without a certificate the main listener refuses the
					// handshake: no endpoint is reachable.
					require.Error(t, err)
					require.Contains(t, err.Error(), "certificate required")
				case isJoin:
					// The join endpoint is not on the main listener.
					require.NoError(t, err)
					require.True(t, unrouted(status, body), "%d %s", status, body)
				case mayCall:
					require.NoError(t, err)
					require.False(t, roleDenied(status, body), "%s must be allowed to call %s: %d %s", c.role, pattern, status, body)
					require.False(t, unrouted(status, body), "%d %s", status, body)
				default:
					require.NoError(t, err)
					require.True(t, roleDenied(status, body), "%s must be refused %s: %d %s", c.role, pattern, status, body)
				}

				// The join name serves the join endpoint and nothing else,
				// whatever certificate the client holds.
				status, body, err = callEndpoint(t, env, c.tls, JoinServerName, pattern)
				require.NoError(t, err)
				if isJoin {
					require.False(t, unrouted(status, body), "%d %s", status, body)
					require.False(t, roleDenied(status, body), body)
				} else {
					require.True(t, unrouted(status, body), "%d %s", status, body)
				}
			})
		}
	}
}

// TestProxyIdentityCannotMintUserCerts is the attack of issue 10 item 3: a
// proxy joined with an ordinary proxy token takes its identity and asks
// the auth API, over raw HTTPS, for a certificate for "admin" without a
// password. It is refused, and logging in with the user's credentials
// remains the proxy's only way to a user certificate.
func TestProxyIdentityCannotMintUserCerts(t *testing.T) {
	env := newTestAPI(t)
	ctx := context.Background()
	_, err := env.auth.CreateUser(ctx, "admin", []byte("admin-password"), []string{"root"}, []string{services.PresetAdminRole}, false)
	require.NoError(t, err)
	tok, err := env.auth.CreateToken(ctx, services.TokenTypeProxy, time.Hour)
	require.NoError(t, err)
	proxyID, err := Join(ctx, joinParams(env, tok.Name, RoleProxy, "evil-proxy"))
	require.NoError(t, err)
	_, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)

	body, err := json.Marshal(authapi.UserCertRequest{User: "admin", PublicKey: pub, TTL: time.Hour})
	require.NoError(t, err)
	cfg := proxyID.ClientTLSConfig()
	cfg.Time = env.clock.Now
	tr := &http.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Post("https://"+env.addr+"/v1/certs/user", "application/json", strings.NewReader(string(body)))
	require.NoError(t, err)
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, string(data))
	require.NotContains(t, string(data), "ssh-ed25519-cert")
	require.Contains(t, string(data), `role \"proxy\" may not call POST /v1/certs/user`)

	// The same through the client, and the password-less login endpoint
	// does not exist for a proxy either way: only credentials work.
	proxy := env.client(t, proxyID)
	_, err = proxy.GenerateUserCert(ctx, authapi.UserCertRequest{User: "admin", PublicKey: pub, TTL: time.Hour})
	requireKind(t, err, trace.IsAccessDenied, "may not call")
	_, err = proxy.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{AuthRequest: authapi.AuthRequest{User: "admin", RemoteAddr: "192.0.2.1"}, PublicKey: pub, TTL: time.Hour})
	requireKind(t, err, trace.IsAccessDenied, "invalid credentials")
	got, err := proxy.AuthenticateSSHUser(ctx, authapi.SSHLoginRequest{AuthRequest: authapi.AuthRequest{User: "admin", Password: "admin-password", RemoteAddr: "192.0.2.2"}, PublicKey: pub, TTL: time.Hour})
	require.NoError(t, err)
	require.Equal(t, []string{"root"}, parseSSHCert(t, got.Cert).ValidPrincipals)
}
