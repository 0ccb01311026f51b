package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/gravitational/trace"
	"golang.org/x/crypto/nacl/box"
	"golang.org/x/crypto/ssh"
	"golang.org/x/oauth2"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/services"
)

// Single sign-on with OpenID Connect (the wire contract is in
// lib/api/authapi/sso.go). Auth alone speaks to the identity provider and
// decides; the proxy carries the browser there and back. Everything that
// links the two halves of a login (state, nonce, PKCE verifier, where to
// go afterwards) is kept in the backend under the state's hash, for
// authapi.SSOStateTTL, and deleted when the callback takes it: so any
// auth server finishes a login any other started, and a state is good
// for one callback only. No JWT or JWKS handling is written here:
// go-oidc verifies signatures (against the provider's JWKS, refetched
// when a token names an unknown key: key rotation), issuer, audience and
// expiry, and refuses unsigned tokens.

// ConnectorTypeOIDC is the TYPE of an OIDC connector in
// LoginResult.Connector ("oidc:NAME") and SSOConnectorInfo.Type.
const ConnectorTypeOIDC = "oidc"

// MsgNoRole is what a user whose provider account maps to no role is
// told: it is their identity provider's account, and an operator's
// mapping, that needs changing, and no more of the policy is shown.
const MsgNoRole = "your identity provider account maps to no Postern role"

// ssoMethod is the audit method of SSO logins.
const ssoMethod = "oidc"

// idpTimeout bounds each call to an identity provider (discovery, token,
// userinfo, keys): a provider that does not answer must fail the login
// with a reason, not hold the proxy's request until its own timeout.
const idpTimeout = 15 * time.Second

// maxIssuedAtSkew is how far in the future an ID token's iat may be by
// this server's clock. go-oidc checks expiry and nbf, not iat; a token
// issued "later" than now means the two clocks disagree by more than
// this, and expiry checks on such a clock mean little.
const maxIssuedAtSkew = 5 * time.Minute

// Limits on what of a provider's claims becomes traits: traits travel in
// every certificate, and a provider (or whoever controls a profile field
// there) must not be able to make them arbitrarily large.
const (
	maxTraitClaims     = 64
	maxTraitValues     = 64
	maxTraitValueBytes = 512
)

const ssoStatesPrefix = "sso_states"

// ssoState is what a started login keeps for its callback. It holds the
// PKCE verifier and the nonce, so it lives only in the backend (under the
// state's hash, not the state itself: a backend dump does not hand out
// callbacks).
type ssoState struct {
	Connector    string                  `json:"connector"`
	IssuerURL    string                  `json:"issuer_url"`
	Nonce        string                  `json:"nonce"`
	PKCEVerifier string                  `json:"pkce_verifier"`
	RedirectURL  string                  `json:"redirect_url"`
	ReturnTo     string                  `json:"return_to,omitempty"`
	Client       *authapi.SSOClientLogin `json:"client,omitempty"`
	Created      time.Time               `json:"created"`
}

func ssoStateKey(state string) string {
	sum := sha256.Sum256([]byte("postern sso state\x00" + state))
	return backend.Key(ssoStatesPrefix, hex.EncodeToString(sum[:]))
}

// clientSecret reads the connector's secret (the file at each login, so a
// rotated secret applies at once).
func clientSecret(c *services.OIDCConnector) (string, error) {
	if c.Spec.ClientSecretFile == "" {
		return c.Spec.ClientSecret, nil
	}
	b, err := os.ReadFile(c.Spec.ClientSecretFile)
	if err != nil {
		return "", trace.BadParameter("oidc_connector %q: reading client_secret_file: %v", c.Metadata.Name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

func oauthConfig(c *services.OIDCConnector, p *ssoProvider, secret, redirectURL string) *oauth2.Config {
	return &oauth2.Config{
		ClientID:     c.Spec.ClientID,
		ClientSecret: secret,
		Endpoint:     p.provider.Endpoint(),
		RedirectURL:  redirectURL,
		Scopes:       c.Spec.Scopes,
	}
}

// ssoConnector looks the connector up in the backend on every call, so a
// removed connector stops logins at once on every auth server.
func (s *Server) ssoConnector(ctx context.Context, name string) (*services.OIDCConnector, error) {
	c, err := s.store.GetOIDCConnector(ctx, name)
	if trace.IsNotFound(err) {
		return nil, trace.NotFound("unknown SSO connector %q", name)
	}
	return c, trace.Wrap(err)
}

// CheckReturnTo accepts a local path on the proxy: one leading "/", not
// "//" nor "/\" (both of which browsers read as another host), no
// scheme, no host and no control characters.
func CheckReturnTo(p string) error {
	if p == "" {
		return nil
	}
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") {
		return trace.BadParameter("return_to %q is not a local path", p)
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return trace.BadParameter("return_to %q is not a local path", p)
		}
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return trace.BadParameter("return_to %q is not a local path", p)
	}
	return nil
}

// CheckClientRedirectURL accepts psh's loopback listener only:
// http://127.0.0.1:PORT/..., http://[::1]:PORT/... or
// http://localhost:PORT/...: the sealed login goes there, and a redirect
// to anywhere else would hand it to another host.
func CheckClientRedirectURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return trace.BadParameter("client redirect_url %q is not a URL", raw)
	}
	if u.Scheme != "http" || u.User != nil || u.Opaque != "" || u.Fragment != "" {
		return trace.BadParameter("client redirect_url %q: want http://127.0.0.1:PORT/PATH (psh's loopback listener)", raw)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return trace.BadParameter("client redirect_url %q: want http://127.0.0.1:PORT/PATH with a port", raw)
	}
	if host != "127.0.0.1" && host != "::1" && host != "localhost" {
		return trace.BadParameter("client redirect_url %q is not a loopback address", raw)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return trace.BadParameter("client redirect_url %q: bad port", raw)
	}
	return nil
}

// checkProxyRedirectURL accepts the proxy's callback: an absolute https
// URL (the identity provider checks it against what it registered too).
func checkProxyRedirectURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.Fragment != "" {
		return trace.BadParameter("redirect_url %q: want the proxy's https callback URL", raw)
	}
	return nil
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+).
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// CreateSSOAuthRequest starts an SSO login: it answers the identity
// provider's authorization URL and keeps what the callback needs.
func (s *Server) CreateSSOAuthRequest(ctx context.Context, req authapi.SSOAuthRequest) (*authapi.SSOAuthResponse, error) {
	if err := checkProxyRedirectURL(req.RedirectURL); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := CheckReturnTo(req.ReturnTo); err != nil {
		return nil, trace.Wrap(err)
	}
	if cl := req.Client; cl != nil {
		if _, err := parseAuthorizedKey(cl.PublicKey); err != nil {
			return nil, trace.Wrap(err)
		}
		if cl.TTL < 0 {
			return nil, trace.BadParameter("negative ttl")
		}
		if err := CheckClientRedirectURL(cl.RedirectURL); err != nil {
			return nil, trace.Wrap(err)
		}
		if len(cl.SealKey) != 32 {
			return nil, trace.BadParameter("seal_key must be a 32-byte X25519 public key, got %d bytes", len(cl.SealKey))
		}
	}
	c, err := s.ssoConnector(ctx, req.Connector)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	p, err := s.oidcProvider(ctx, c)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	st := ssoState{
		Connector:    c.Metadata.Name,
		IssuerURL:    c.Spec.IssuerURL,
		Nonce:        randomToken(),
		PKCEVerifier: oauth2.GenerateVerifier(),
		RedirectURL:  req.RedirectURL,
		Client:       req.Client,
		Created:      s.clock.Now().UTC(),
	}
	if req.Client == nil {
		st.ReturnTo = req.ReturnTo
	}
	state := randomToken()
	data, err := json.Marshal(st)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	expires := s.store.Backend().Clock().Now().Add(authapi.SSOStateTTL)
	if _, err := s.store.Backend().Create(ctx, backend.Item{Key: ssoStateKey(state), Value: data, Expires: expires}); err != nil {
		return nil, trace.Wrap(err)
	}
	// The secret is not needed to build the URL.
	authURL := oauthConfig(c, p, "", req.RedirectURL).AuthCodeURL(state,
		oidc.Nonce(st.Nonce), oauth2.S256ChallengeOption(st.PKCEVerifier))
	return &authapi.SSOAuthResponse{AuthURL: authURL}, nil
}

// MsgSSOStateGone answers a state that is unknown, expired or already
// used: the three are the same to whoever presents it. The proxy tells
// the user, in their terms, to start again when it sees it.
const MsgSSOStateGone = "unknown, expired or already used SSO login (state); start the login again"

// errSSOState is the answer to a state auth does not hold.
func errSSOState() error {
	return trace.AccessDenied(MsgSSOStateGone)
}

// takeSSOState reads and deletes the state: the Delete is the commit
// point (the backend lets exactly one Delete of a key succeed), so two
// callbacks with one state never both proceed.
func (s *Server) takeSSOState(ctx context.Context, state string) (*ssoState, error) {
	key := ssoStateKey(state)
	item, err := s.store.Backend().Get(ctx, key)
	if trace.IsNotFound(err) {
		return nil, errSSOState()
	}
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := s.store.Backend().Delete(ctx, key); err != nil {
		if trace.IsNotFound(err) {
			return nil, errSSOState()
		}
		return nil, trace.Wrap(err)
	}
	var st ssoState
	if err := json.Unmarshal(item.Value, &st); err != nil {
		return nil, trace.BadParameter("corrupt SSO state record: %v", err)
	}
	return &st, nil
}

// CallbackQuery is what an identity provider sent the browser back with.
type CallbackQuery struct {
	State            string
	Code             string
	Error            string
	ErrorDescription string
}

// maxCallbackQuery bounds the query a callback may carry: codes and
// states are short; anything longer is not from a provider.
const maxCallbackQuery = 16 << 10

// ParseCallbackQuery parses the raw query of a callback. A parameter
// given twice is refused: which of two states or codes is meant is
// exactly what an attacker who can append to a URL would like to choose.
func ParseCallbackQuery(raw string) (CallbackQuery, error) {
	var q CallbackQuery
	if len(raw) > maxCallbackQuery {
		return q, trace.BadParameter("callback query is longer than %d bytes", maxCallbackQuery)
	}
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return q, trace.BadParameter("callback query does not parse: %v", err)
	}
	one := func(name string) (string, error) {
		v := vals[name]
		switch len(v) {
		case 0:
			return "", nil
		case 1:
			return v[0], nil
		}
		return "", trace.BadParameter("callback query has %q %d times", name, len(v))
	}
	for name, dst := range map[string]*string{"state": &q.State, "code": &q.Code, "error": &q.Error, "error_description": &q.ErrorDescription} {
		if *dst, err = one(name); err != nil {
			return CallbackQuery{}, trace.Wrap(err)
		}
	}
	if q.State == "" {
		return CallbackQuery{}, trace.BadParameter("callback query has no state")
	}
	if q.Error == "" && q.Code == "" {
		return CallbackQuery{}, trace.BadParameter("callback query has neither code nor error")
	}
	return q, nil
}

// ssoAuditReason is the audit reason of a refused SSO login: the one
// marked on the error (auditReasonField) when there is one, else what the
// caller was told.
func ssoAuditReason(err error) string {
	var te trace.Error
	if errors.As(err, &te) {
		if r, ok := te.GetFields()[auditReasonField].(string); ok && r != "" {
			return r
		}
	}
	return trace.UserMessage(err)
}

// ssoFailure is a refused callback: err goes to the caller, reason and
// claims to the audit log.
type ssoFailure struct {
	connector string
	user      string
	claims    map[string][]string
}

// ValidateSSOCallback finishes an SSO login from the identity provider's
// callback. Every refusal after the query parsed is audited as
// auth.failed with method oidc.
func (s *Server) ValidateSSOCallback(ctx context.Context, req authapi.SSOCallbackRequest) (resp *authapi.SSOCallbackResponse, err error) {
	var fail ssoFailure
	defer func() {
		if err != nil {
			s.emitSSOLogin(ctx, events.AuthFailed, fail.user, fail.connector, req.RemoteAddr, ssoAuditReason(err), fail.claims)
		}
	}()
	q, err := ParseCallbackQuery(req.Query)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	st, err := s.takeSSOState(ctx, q.State)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	fail.connector = st.Connector
	if q.Error != "" {
		msg := "the identity provider refused the login: " + q.Error
		if q.ErrorDescription != "" {
			msg += ": " + q.ErrorDescription
		}
		return nil, trace.AccessDenied("%s", sanitizeIdPText(msg))
	}
	if st.Client == nil && req.WebSession == nil {
		return nil, trace.BadParameter("a browser SSO login needs the web session to create")
	}
	c, err := s.ssoConnector(ctx, st.Connector)
	if err != nil {
		if trace.IsNotFound(err) {
			return nil, trace.AccessDenied("SSO connector %q was removed while the login was under way", st.Connector)
		}
		return nil, trace.Wrap(err)
	}
	if c.Spec.IssuerURL != st.IssuerURL {
		return nil, trace.AccessDenied("SSO connector %q changed its issuer while the login was under way; start the login again", st.Connector)
	}
	claims, err := s.exchangeAndVerify(ctx, c, st, q.Code)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	traits := TraitsFromClaims(claims)
	roles, seen := c.MapClaims(traits)
	fail.claims = seen
	username, err := usernameFromClaims(c, claims)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	fail.user = username
	if len(roles) == 0 {
		return nil, trace.WithField(trace.AccessDenied(MsgNoRole), auditReasonField, "claims map to no role")
	}
	externalTraits := make(map[string][]string, len(traits))
	for k, v := range traits {
		externalTraits[services.TraitExternalPrefix+k] = v
	}
	if err := s.upsertSSOUser(ctx, c, username, roles, externalTraits); err != nil {
		return nil, trace.Wrap(err)
	}
	res := &LoginResult{
		User:      username,
		Connector: ConnectorTypeOIDC + ":" + c.Metadata.Name,
		Roles:     roles,
		Traits:    externalTraits,
	}
	resp = &authapi.SSOCallbackResponse{Username: username}
	if cl := st.Client; cl != nil {
		login, err := s.completeLogin(ctx, res, LoginOutput{PublicKey: cl.PublicKey, TTL: cl.TTL})
		if err != nil {
			return nil, trace.Wrap(err)
		}
		sealed, err := sealLogin(login, cl.SealKey)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		resp.ClientRedirectURL = cl.RedirectURL
		resp.SealedLogin = sealed
	} else {
		// A web session needs a certificate only for its lifetime (the
		// proxy gets the session's certificates later, for keys of its
		// own): certify a throwaway key so that the same checks and caps
		// apply as to every other login.
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		sshPub, err := ssh.NewPublicKey(pub)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		if _, err := s.completeLogin(ctx, res, LoginOutput{PublicKey: ssh.MarshalAuthorizedKey(sshPub), WebSession: req.WebSession}); err != nil {
			return nil, trace.Wrap(err)
		}
		// Checked when the login started, and again here: the state
		// came from the backend.
		if err := CheckReturnTo(st.ReturnTo); err != nil {
			return nil, trace.Wrap(err)
		}
		resp.ReturnTo = st.ReturnTo
		if resp.ReturnTo == "" {
			resp.ReturnTo = "/"
		}
	}
	s.emitSSOLogin(ctx, events.AuthLogin, username, c.Metadata.Name, req.RemoteAddr, "", nil)
	return resp, nil
}

// exchangeAndVerify trades the code (with the PKCE verifier) for tokens
// and checks the ID token; it returns its claims, completed from
// userinfo when the ID token lacks a claim the connector uses.
func (s *Server) exchangeAndVerify(ctx context.Context, c *services.OIDCConnector, st *ssoState, code string) (map[string]any, error) {
	p, err := s.oidcProvider(ctx, c)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	secret, err := clientSecret(c)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	ictx, cancel := context.WithTimeout(ctx, idpTimeout)
	defer cancel()
	ictx = oidc.ClientContext(ictx, p.client)
	tok, err := oauthConfig(c, p, secret, st.RedirectURL).Exchange(ictx, code, oauth2.VerifierOption(st.PKCEVerifier))
	if err != nil {
		return nil, trace.AccessDenied("the identity provider refused the authorization code: %v", sanitizeIdPText(err.Error()))
	}
	rawID, _ := tok.Extra("id_token").(string)
	if rawID == "" {
		return nil, trace.AccessDenied("the identity provider sent no ID token")
	}
	idToken, err := s.verifyIDToken(ictx, c, p, rawID, st.Nonce)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	claims := map[string]any{}
	if err := idToken.Claims(&claims); err != nil {
		return nil, trace.AccessDenied("the ID token's claims do not parse: %v", err)
	}
	if !hasConnectorClaims(c, claims) {
		info, err := p.provider.UserInfo(ictx, oauth2.StaticTokenSource(tok))
		if err != nil {
			return nil, trace.AccessDenied("the identity provider's userinfo failed: %v", sanitizeIdPText(err.Error()))
		}
		// Userinfo about someone else is not about this login.
		if info.Subject != idToken.Subject {
			return nil, trace.AccessDenied("the identity provider's userinfo is about another subject")
		}
		var extra map[string]any
		if err := info.Claims(&extra); err != nil {
			return nil, trace.AccessDenied("the userinfo claims do not parse: %v", err)
		}
		for k, v := range extra {
			if _, ok := claims[k]; !ok {
				claims[k] = v
			}
		}
	}
	return claims, nil
}

// verifyIDToken checks signature (the provider's JWKS; "none" and
// unsigned tokens are refused by go-oidc), issuer, audience (client_id),
// expiry by this server's clock, iat not in the future, and the nonce.
func (s *Server) verifyIDToken(ctx context.Context, c *services.OIDCConnector, p *ssoProvider, rawID, nonce string) (*oidc.IDToken, error) {
	// Verifier, not VerifierContext: it uses the provider's one cached
	// key set (fetched again only for a key it does not know), where
	// VerifierContext makes a new, empty one, fetching the JWKS at every
	// login. The key set's fetches use the provider's HTTP client (the
	// connector's CA, idpTimeout).
	v := p.provider.Verifier(&oidc.Config{ClientID: c.Spec.ClientID, Now: s.clock.Now})
	idToken, err := v.Verify(ctx, rawID)
	if err != nil {
		return nil, trace.AccessDenied("the ID token is not valid: %v", err)
	}
	if !idToken.IssuedAt.IsZero() && idToken.IssuedAt.After(s.clock.Now().Add(maxIssuedAtSkew)) {
		return nil, trace.AccessDenied("the ID token was issued at %s, in the future by this auth server's clock: the clocks disagree", idToken.IssuedAt.UTC().Format(time.RFC3339))
	}
	if subtle.ConstantTimeCompare([]byte(idToken.Nonce), []byte(nonce)) != 1 {
		return nil, trace.AccessDenied("the ID token's nonce does not match this login")
	}
	return idToken, nil
}

// hasConnectorClaims reports whether claims hold every claim c uses.
func hasConnectorClaims(c *services.OIDCConnector, claims map[string]any) bool {
	if _, ok := claims[c.Spec.UsernameClaim]; !ok {
		return false
	}
	for _, m := range c.Spec.ClaimsToRoles {
		if _, ok := claims[m.Claim]; !ok {
			return false
		}
	}
	return true
}

// TraitsFromClaims keeps the claims whose value is a string or a list of
// strings, bounded in number and size (see maxTraitClaims); others
// (numbers, objects, booleans) are left out.
func TraitsFromClaims(claims map[string]any) map[string][]string {
	names := make([]string, 0, len(claims))
	for k := range claims {
		names = append(names, k)
	}
	slices.Sort(names)
	out := map[string][]string{}
	for _, k := range names {
		if len(out) >= maxTraitClaims {
			break
		}
		if services.CheckClaimName(k) != nil {
			continue
		}
		var vals []string
		switch v := claims[k].(type) {
		case string:
			vals = []string{v}
		case []any:
			for _, e := range v {
				if s, ok := e.(string); ok && len(vals) < maxTraitValues {
					vals = append(vals, s)
				}
			}
		}
		vals = slices.DeleteFunc(vals, func(s string) bool { return s == "" || len(s) > maxTraitValueBytes })
		if len(vals) > 0 {
			out[k] = vals
		}
	}
	return out
}

func usernameFromClaims(c *services.OIDCConnector, claims map[string]any) (string, error) {
	v, ok := claims[c.Spec.UsernameClaim]
	if !ok {
		return "", trace.AccessDenied("the identity provider sent no %q claim (the connector's username_claim)", c.Spec.UsernameClaim)
	}
	name, ok := v.(string)
	if !ok {
		return "", trace.AccessDenied("the identity provider's %q claim is not a string", c.Spec.UsernameClaim)
	}
	if err := services.CheckUserName(name); err != nil {
		return "", trace.AccessDenied("the identity provider's %q claim is not a valid Postern user name: %v", c.Spec.UsernameClaim, trace.UserMessage(err))
	}
	return name, nil
}

// upsertSSOUser writes the user's record with this login's roles and
// traits. A local user of the same name is never taken over: an identity
// provider (or whoever can set an email address there) must not become a
// password user who was created by an admin.
func (s *Server) upsertSSOUser(ctx context.Context, c *services.OIDCConnector, name string, roles []string, traits map[string][]string) error {
	marker := services.ConnectorMarker(c.Metadata.Name)
	created := s.clock.Now().UTC()
	existing, err := s.store.GetUser(ctx, name)
	switch {
	case err == nil:
		if existing.Connector != marker {
			by := "a local user"
			if existing.Connector != "" {
				by = "a user of " + existing.Connector
			}
			return trace.WithField(trace.AccessDenied("user %q already exists as %s; this identity provider may not log in as them", name, by),
				auditReasonField, "user exists with another connector")
		}
		created = existing.Created
	case !trace.IsNotFound(err):
		return trace.Wrap(err)
	}
	return trace.Wrap(s.store.UpsertUser(ctx, services.User{
		Name: name, Roles: roles, Traits: traits, Created: created, Connector: marker,
	}))
}

// sealLogin seals the JSON of a CLI login to psh's ephemeral key: only
// the psh process holding the private key opens it.
func sealLogin(login *authapi.SSHLoginResponse, sealKey []byte) ([]byte, error) {
	if len(sealKey) != 32 {
		return nil, trace.BadParameter("seal_key must be 32 bytes")
	}
	data, err := json.Marshal(login)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var pub [32]byte
	copy(pub[:], sealKey)
	sealed, err := box.SealAnonymous(nil, data, &pub, rand.Reader)
	return sealed, trace.Wrap(err)
}

// sanitizeIdPText bounds and cleans text that came from an identity
// provider (error codes and descriptions) before it reaches a log, an
// audit event or a browser.
func sanitizeIdPText(s string) string {
	const max = 512
	if len(s) > max {
		s = s[:max] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return ' '
		}
		return r
	}, s)
}

// emitSSOLogin audits an SSO login: method oidc, the connector, and for
// a refusal the reason and the claims the role mapping looked at.
func (s *Server) emitSSOLogin(ctx context.Context, typ, user, connector, remoteAddr, reason string, claims map[string][]string) {
	fields := events.Fields{events.FieldRemoteAddr: remoteAddr, events.FieldMethod: ssoMethod}
	if connector != "" {
		fields[events.FieldConnector] = connector
	}
	if reason != "" {
		fields[events.FieldReason] = reason
	}
	if len(claims) > 0 {
		fields[events.FieldClaims] = claims
	}
	s.cfg.Audit.Emit(ctx, events.Event{Type: typ, User: user, Fields: fields})
}
