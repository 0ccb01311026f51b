package authapi

import "time"

// Single sign-on over the auth API (OIDC). The proxy speaks to the browser
// and to psh; auth speaks to the identity provider and decides. A login is
// two calls, and any proxy (and any auth server) may serve either, because
// what links them (the state, with its nonce and PKCE verifier) is kept in
// the backend, single use, for SSOStateTTL:
//
//  1. POST /v1/sso/requests (proxy only): CreateSSOAuthRequest. Auth looks
//     the connector up, makes state, nonce and a PKCE verifier, stores them
//     with the request, and answers the identity provider's authorization
//     URL (redirect_uri = the proxy's callback, nothing else).
//  2. POST /v1/sso/callback (proxy only): ValidateSSOCallback, with the
//     query the identity provider sent the browser back with. Auth takes
//     the state (once), exchanges the code with the PKCE verifier, checks
//     the ID token (issuer, audience, expiry, signature by the provider's
//     JWKS, nonce), maps the claims to roles, creates or updates the user
//     record, and completes the login through the same seam as a password
//     login (lib/auth completeLogin): locks, roles, TTL alike.

// SSOStateTTL is how long a started SSO login may take to come back: long
// enough for a person to type a password and a second factor at their
// identity provider, short enough that a stolen state is soon useless.
const SSOStateTTL = 10 * time.Minute

// SSOAuthRequest starts an SSO login (POST /v1/sso/requests).
type SSOAuthRequest struct {
	// Connector names the oidc_connector.
	Connector string `json:"connector"`
	// RedirectURL is the proxy's callback, https://PROXY/webapi/oidc/callback:
	// what the identity provider sends the browser back to.
	RedirectURL string `json:"redirect_url"`
	// ReturnTo is, for a browser login, the path on the proxy the user was
	// going to (a terminal deep link included): a path starting with one
	// "/", never a URL, checked by the proxy and again by auth.
	ReturnTo string `json:"return_to,omitempty"`
	// Client is set for a CLI login (psh login --auth NAME).
	Client *SSOClientLogin `json:"client,omitempty"`
}

// SSOClientLogin is what a CLI login binds the SSO login to. The result
// is sealed to SealKey, which only that psh process holds, so a copied
// callback URL (or the loopback redirect itself, replayed to another psh)
// is useless to anybody else.
type SSOClientLogin struct {
	// PublicKey is the SSH key to certify (authorized_keys form).
	PublicKey []byte `json:"public_key"`
	// TTL is the wanted certificate lifetime (capped by the roles).
	TTL time.Duration `json:"ttl"`
	// RedirectURL is psh's loopback listener, http://127.0.0.1:PORT/callback:
	// the proxy redirects the browser there with the sealed result.
	RedirectURL string `json:"redirect_url"`
	// SealKey is psh's ephemeral X25519 public key (32 bytes): the
	// result is sealed with golang.org/x/crypto/nacl/box.SealAnonymous.
	SealKey []byte `json:"seal_key"`
}

// SSOAuthResponse answers SSOAuthRequest.
type SSOAuthResponse struct {
	// AuthURL is where to send the browser: the identity provider's
	// authorization endpoint with client_id, redirect_uri, scope, state,
	// nonce and the PKCE challenge.
	AuthURL string `json:"auth_url"`
}

// SSOCallbackRequest finishes an SSO login (POST /v1/sso/callback).
type SSOCallbackRequest struct {
	// Query is the raw query string the identity provider sent the browser
	// back with (state, code; or error, error_description).
	Query string `json:"query"`
	// WebSession is the browser session to create (the proxy made the
	// secrets, as for a password login); ignored for a CLI login.
	WebSession *WebSessionInit `json:"web_session,omitempty"`
	// RemoteAddr is the browser's address, for audit.
	RemoteAddr string `json:"remote_addr,omitempty"`
}

// SSOCallbackResponse says how the login ended.
type SSOCallbackResponse struct {
	// Username is who logged in.
	Username string `json:"username"`
	// ReturnTo is, for a browser login, where to send the browser now
	// (the web session was created).
	ReturnTo string `json:"return_to,omitempty"`
	// ClientRedirectURL and SealedLogin are, for a CLI login, where to
	// send the browser and what to hand psh there: the JSON of an
	// SSHLoginResponse (certificate and host CAs), sealed to the
	// request's SealKey. The proxy passes it on unread.
	ClientRedirectURL string `json:"client_redirect_url,omitempty"`
	SealedLogin       []byte `json:"sealed_login,omitempty"`
}

// SSOConnectorInfo is what anyone may know of a connector: GET
// /v1/sso/connectors (proxy only) and, through the proxy, /webapi/ping.
type SSOConnectorInfo struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Display string `json:"display"`
}
