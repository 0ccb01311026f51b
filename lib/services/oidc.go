package services

import (
	"context"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// KindOIDCConnector is an OpenID Connect identity provider users may log
// in with (single sign-on): `pctl create -f`, `pctl get oidc_connector`,
// `pctl rm oidc_connector/NAME`.
const KindOIDCConnector = "oidc_connector"

// DefaultUsernameClaim is the claim a connector takes the Postern user
// name from when username_claim is not set.
const DefaultUsernameClaim = "email"

// ScopeOpenID is the scope every OIDC request carries: without it the
// provider answers plain OAuth 2.0 and sends no ID token at all.
const ScopeOpenID = "openid"

// OIDCConnector is an identity provider. Its users need no record of
// their own before their first login: the auth server creates one at each
// login (User.Connector says which connector), with the roles the
// provider's claims map to at that login, so that a change at the
// provider (a group removed) takes effect at the next login.
type OIDCConnector struct {
	Kind     string            `json:"kind,omitempty"`
	Version  string            `json:"version,omitempty"`
	Metadata Metadata          `json:"metadata"`
	Spec     OIDCConnectorSpec `json:"spec"`
}

// OIDCConnectorSpec is the body of OIDCConnector.
type OIDCConnectorSpec struct {
	// Display is the button text's NAME: "Sign in with NAME". Default:
	// the connector's name.
	Display string `json:"display,omitempty"`
	// IssuerURL is the provider's issuer; its discovery document is at
	// IssuerURL/.well-known/openid-configuration. HTTPS only: the
	// discovery document names the keys that sign every token, so
	// whoever can alter it in transit can log in as anyone.
	IssuerURL string `json:"issuer_url"`
	// CAFile, when set, is a PEM file on the auth server with the CA
	// that signed the provider's TLS certificate (a private CA); it then
	// replaces the system roots for that provider.
	CAFile string `json:"ca_file,omitempty"`
	// ClientID is what the provider registered Postern as; ID tokens must
	// name it as their audience.
	ClientID string `json:"client_id"`
	// ClientSecret is the client's secret, inline. It never leaves the
	// auth server: every read path but the auth server's own strips it
	// (WithoutSecrets). Prefer ClientSecretFile.
	ClientSecret string `json:"client_secret,omitempty"`
	// ClientSecretFile is a file on the auth server holding the secret
	// (surrounding white space ignored), read at every login so that a
	// rotated secret applies without touching the resource.
	ClientSecretFile string `json:"client_secret_file,omitempty"`
	// Scopes are requested from the provider; "openid" is always added.
	Scopes []string `json:"scopes,omitempty"`
	// UsernameClaim is the claim that names the Postern user (default
	// "email"); its value must be a valid Postern user name.
	UsernameClaim string `json:"username_claim,omitempty"`
	// ClaimsToRoles maps claims to roles; every matching entry adds its
	// roles. A login whose claims match no entry is refused.
	ClaimsToRoles []ClaimMapping `json:"claims_to_roles"`
}

// ClaimMapping grants Roles to a login whose claim Claim has a value
// matching Value (a path.Match glob: "*@example.com", "admins"). A
// claim with a list of values (groups) matches when any value does.
type ClaimMapping struct {
	Claim string   `json:"claim"`
	Value string   `json:"value"`
	Roles []string `json:"roles"`
}

// CheckConnectorName validates a connector name: it is a backend key
// component, part of the TYPE:NAME marker on users and in audit events,
// and typed in `psh login --auth NAME`.
func CheckConnectorName(name string) error {
	return checkName("connector name", name, "._-")
}

// CheckAndSetDefaults validates a connector as written by an operator and
// fills in what defaults (kind, version, display, scopes, username_claim),
// so that what `pctl get` shows is what is used. A missing client secret
// is allowed here (a resource printed by `pctl get` has it stripped and
// may be written back): the auth server keeps the stored secret then, and
// refuses a connector that has none (Server.UpsertOIDCConnector).
func (c *OIDCConnector) CheckAndSetDefaults() error {
	if c.Kind == "" {
		c.Kind = KindOIDCConnector
	}
	if c.Kind != KindOIDCConnector {
		return trace.BadParameter("kind %q is not %q", c.Kind, KindOIDCConnector)
	}
	if c.Version == "" {
		c.Version = V1
	}
	if c.Version != V1 {
		return trace.BadParameter("oidc_connector %q: unsupported version %q, want %q", c.Metadata.Name, c.Version, V1)
	}
	if err := CheckConnectorName(c.Metadata.Name); err != nil {
		return trace.BadParameter("oidc_connector metadata.name: %v", err)
	}
	name := c.Metadata.Name
	s := &c.Spec
	if s.Display == "" {
		s.Display = name
	}
	if err := CheckIssuerURL(s.IssuerURL); err != nil {
		return trace.BadParameter("oidc_connector %q: spec.issuer_url: %v", name, err)
	}
	if s.ClientID == "" {
		return trace.BadParameter("oidc_connector %q: spec.client_id is empty", name)
	}
	if s.ClientSecret != "" && s.ClientSecretFile != "" {
		return trace.BadParameter("oidc_connector %q: set spec.client_secret or spec.client_secret_file, not both", name)
	}
	if s.CAFile != "" && !path.IsAbs(s.CAFile) {
		return trace.BadParameter("oidc_connector %q: spec.ca_file %q must be an absolute path on the auth server", name, s.CAFile)
	}
	if s.ClientSecretFile != "" && !path.IsAbs(s.ClientSecretFile) {
		return trace.BadParameter("oidc_connector %q: spec.client_secret_file %q must be an absolute path on the auth server", name, s.ClientSecretFile)
	}
	for _, sc := range s.Scopes {
		if sc == "" || strings.ContainsAny(sc, " \t\r\n\"\\") {
			return trace.BadParameter("oidc_connector %q: spec.scopes: %q is not a scope", name, sc)
		}
	}
	if !slices.Contains(s.Scopes, ScopeOpenID) {
		s.Scopes = append([]string{ScopeOpenID}, s.Scopes...)
	}
	if s.UsernameClaim == "" {
		s.UsernameClaim = DefaultUsernameClaim
	}
	if err := CheckClaimName(s.UsernameClaim); err != nil {
		return trace.BadParameter("oidc_connector %q: spec.username_claim: %v", name, err)
	}
	if len(s.ClaimsToRoles) == 0 {
		return trace.BadParameter("oidc_connector %q: spec.claims_to_roles is empty: map at least one claim, e.g. [{claim: email, value: \"*@example.com\", roles: [access]}]", name)
	}
	for i, m := range s.ClaimsToRoles {
		if err := CheckClaimName(m.Claim); err != nil {
			return trace.BadParameter("oidc_connector %q: claims_to_roles[%d]: claim: %v", name, i, err)
		}
		if m.Value == "" {
			return trace.BadParameter("oidc_connector %q: claims_to_roles[%d] (claim %q): value is empty (\"*\" matches any value)", name, i, m.Claim)
		}
		if _, err := path.Match(m.Value, ""); err != nil {
			return trace.BadParameter("oidc_connector %q: claims_to_roles[%d] (claim %q): value %q is not a valid glob", name, i, m.Claim, m.Value)
		}
		if len(m.Roles) == 0 {
			return trace.BadParameter("oidc_connector %q: claims_to_roles[%d] (claim %q): roles is empty", name, i, m.Claim)
		}
		for _, r := range m.Roles {
			if err := CheckRoleName(r); err != nil {
				return trace.BadParameter("oidc_connector %q: claims_to_roles[%d] (claim %q): roles: %v", name, i, m.Claim, err)
			}
		}
	}
	return nil
}

// CheckIssuerURL accepts an absolute https URL with a host and without
// query, fragment or user info (the issuer is compared byte for byte
// with every token's iss claim).
func CheckIssuerURL(raw string) error {
	if raw == "" {
		return trace.BadParameter("is empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return trace.BadParameter("%q is not a URL", raw)
	}
	if u.Scheme != "https" {
		return trace.BadParameter("%q is not https: the provider's discovery document and keys must come over TLS", raw)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return trace.BadParameter("%q: want https://HOST[:PORT][/PATH], without user, query or fragment", raw)
	}
	return nil
}

// maxClaimNameLen bounds a claim name: claim names become trait names
// (external.NAME) inside certificates.
const maxClaimNameLen = 128

// CheckClaimName accepts the claim names role templates can name:
// letters, digits and "_-.:/" (URL-like claim names of some providers).
func CheckClaimName(name string) error {
	if name == "" {
		return trace.BadParameter("claim name is empty")
	}
	if len(name) > maxClaimNameLen {
		return trace.BadParameter("claim name %q is longer than %d characters", name, maxClaimNameLen)
	}
	for _, r := range name {
		if !(r < 128 && (isASCIILetterOrDigit(r) || strings.ContainsRune("_-.:/", r))) {
			return trace.BadParameter("claim name %q contains %q", name, r)
		}
	}
	return nil
}

// MapClaims returns the roles claims grant, sorted and without
// duplicates, and the claims the mapping looked at (those named by an
// entry, with the values the login had): what an audit event shows of a
// refused login, and nothing else of the user's profile. claims holds
// each claim's values as strings (TraitsFromClaims), keyed by claim name.
func (c *OIDCConnector) MapClaims(claims map[string][]string) (roles []string, seen map[string][]string) {
	seen = map[string][]string{}
	for _, m := range c.Spec.ClaimsToRoles {
		vals, ok := claims[m.Claim]
		if ok {
			seen[m.Claim] = vals
		}
		for _, v := range vals {
			if ok, _ := path.Match(m.Value, v); ok {
				roles = append(roles, m.Roles...)
				break
			}
		}
	}
	slices.Sort(roles)
	return slices.Compact(roles), seen
}

// WithoutSecrets is a copy without the inline client secret: what every
// reader but the auth server itself gets.
func (c *OIDCConnector) WithoutSecrets() OIDCConnector {
	out := *c
	out.Spec.ClientSecret = ""
	out.Spec.Scopes = slices.Clone(c.Spec.Scopes)
	out.Spec.ClaimsToRoles = slices.Clone(c.Spec.ClaimsToRoles)
	return out
}

// ConnectorMarker is what User.Connector says of a user an identity
// provider's connector created: "sso:NAME".
func ConnectorMarker(name string) string { return "sso:" + name }

const oidcConnectorsPrefix = "oidc_connectors"

// UpsertOIDCConnector validates and writes a connector (secret included).
func (s *Store) UpsertOIDCConnector(ctx context.Context, c *OIDCConnector) error {
	if c == nil {
		return trace.BadParameter("missing oidc_connector")
	}
	if err := c.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	return s.put(ctx, backend.Key(oidcConnectorsPrefix, c.Metadata.Name), c, time.Time{})
}

// GetOIDCConnector returns one connector, its secret included: callers
// that hand it out must use WithoutSecrets.
func (s *Store) GetOIDCConnector(ctx context.Context, name string) (*OIDCConnector, error) {
	msg := "oidc_connector " + quote(name) + " not found"
	if CheckConnectorName(name) != nil {
		return nil, trace.NotFound("%s", msg)
	}
	var c OIDCConnector
	if err := s.get(ctx, backend.Key(oidcConnectorsPrefix, name), &c, msg); err != nil {
		return nil, err
	}
	return &c, nil
}

// GetOIDCConnectors returns every connector, by name, secrets included.
func (s *Store) GetOIDCConnectors(ctx context.Context) ([]OIDCConnector, error) {
	return getAll[OIDCConnector](ctx, s, backend.Prefix(oidcConnectorsPrefix))
}

// DeleteOIDCConnector removes a connector.
func (s *Store) DeleteOIDCConnector(ctx context.Context, name string) error {
	msg := "oidc_connector " + quote(name) + " not found"
	if CheckConnectorName(name) != nil {
		return trace.NotFound("%s", msg)
	}
	return s.delete(ctx, backend.Key(oidcConnectorsPrefix, name), msg)
}
