package services

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func validConnector() *OIDCConnector {
	return &OIDCConnector{
		Metadata: Metadata{Name: "corp"},
		Spec: OIDCConnectorSpec{
			IssuerURL: "https://idp.example.com/", ClientID: "postern", ClientSecretFile: "/etc/postern/oidc-secret",
			ClaimsToRoles: []ClaimMapping{{Claim: "email", Value: "*@example.com", Roles: []string{"access"}}},
		},
	}
}

// TestOIDCConnectorCheck: defaults are filled in (openid always asked
// for, email as the user name) and every malformed field is named.
func TestOIDCConnectorCheck(t *testing.T) {
	c := validConnector()
	require.NoError(t, c.CheckAndSetDefaults())
	require.Equal(t, []string{"openid"}, c.Spec.Scopes)
	require.Equal(t, "email", c.Spec.UsernameClaim)
	require.Equal(t, "corp", c.Spec.Display)
	require.Equal(t, KindOIDCConnector, c.Kind)

	for name, tc := range map[string]struct {
		edit func(*OIDCConnector)
		want string
	}{
		"http issuer":     {func(c *OIDCConnector) { c.Spec.IssuerURL = "http://idp.example.com" }, "not https"},
		"issuer query":    {func(c *OIDCConnector) { c.Spec.IssuerURL = "https://idp.example.com/?x=1" }, "without user, query or fragment"},
		"no client id":    {func(c *OIDCConnector) { c.Spec.ClientID = "" }, "client_id is empty"},
		"both secrets":    {func(c *OIDCConnector) { c.Spec.ClientSecret = "s" }, "not both"},
		"relative ca":     {func(c *OIDCConnector) { c.Spec.CAFile = "ca.pem" }, "absolute path"},
		"no mapping":      {func(c *OIDCConnector) { c.Spec.ClaimsToRoles = nil }, "claims_to_roles is empty"},
		"bad glob":        {func(c *OIDCConnector) { c.Spec.ClaimsToRoles[0].Value = "[" }, "not a valid glob"},
		"no roles":        {func(c *OIDCConnector) { c.Spec.ClaimsToRoles[0].Roles = nil }, "roles is empty"},
		"bad role":        {func(c *OIDCConnector) { c.Spec.ClaimsToRoles[0].Roles = []string{"a b"} }, "roles"},
		"bad claim":       {func(c *OIDCConnector) { c.Spec.ClaimsToRoles[0].Claim = "a b" }, "claim"},
		"bad name":        {func(c *OIDCConnector) { c.Metadata.Name = "a/b" }, "metadata.name"},
		"bad scope":       {func(c *OIDCConnector) { c.Spec.Scopes = []string{"a b"} }, "not a scope"},
		"bad user claim":  {func(c *OIDCConnector) { c.Spec.UsernameClaim = "{{x}}" }, "username_claim"},
		"wrong kind":      {func(c *OIDCConnector) { c.Kind = "role" }, "is not"},
		"empty map value": {func(c *OIDCConnector) { c.Spec.ClaimsToRoles[0].Value = "" }, "value is empty"},
	} {
		c := validConnector()
		tc.edit(c)
		err := c.CheckAndSetDefaults()
		require.Error(t, err, name)
		require.Contains(t, err.Error(), tc.want, name)
	}
}

// TestOIDCMapClaims: every matching entry adds its roles; a list claim
// matches when any value does; the claims seen are only the mapped ones.
func TestOIDCMapClaims(t *testing.T) {
	c := validConnector()
	c.Spec.ClaimsToRoles = append(c.Spec.ClaimsToRoles,
		ClaimMapping{Claim: "groups", Value: "ops", Roles: []string{"ops", "access"}},
		ClaimMapping{Claim: "groups", Value: "dev-*", Roles: []string{"dev"}})
	require.NoError(t, c.CheckAndSetDefaults())
	roles, seen := c.MapClaims(map[string][]string{"email": {"a@example.com"}, "groups": {"x", "dev-1"}, "name": {"A"}})
	require.Equal(t, []string{"access", "dev"}, roles)
	require.Equal(t, map[string][]string{"email": {"a@example.com"}, "groups": {"x", "dev-1"}}, seen)
	roles, _ = c.MapClaims(map[string][]string{"email": {"a@example.com.evil"}})
	require.Empty(t, roles)
	require.Empty(t, c.WithoutSecrets().Spec.ClientSecret)
}

// TestExternalLoginTemplates: {{external.CLAIM}} and
// {{email.local(external.CLAIM)}} expand from external traits only, and
// values that are not valid logins are dropped.
func TestExternalLoginTemplates(t *testing.T) {
	role := &Role{Metadata: Metadata{Name: "sso"}, Spec: RoleSpec{Logins: []string{
		"{{external.username}}", "{{email.local(external.email)}}", "{{internal.logins}}",
	}}}
	require.NoError(t, role.CheckAndSetDefaults())
	checker := NewAccessChecker([]*Role{role}, map[string][]string{
		"external.username": {"bob", "-oProxyCommand=x", "a b"},
		"external.email":    {"carol@example.com", "@nobody", "noat"},
		"logins":            {"root"},
		// A claim named logins is external.logins, never internal.logins.
		"external.logins": {"admin"},
	})
	require.Equal(t, []string{"bob", "carol", "root"}, checker.Logins())
	for _, bad := range []string{"{{external}}", "{{email.local(internal.logins)}}", "{{external.a b}}", "{{email.local(external.x}}"} {
		r := &Role{Metadata: Metadata{Name: "x"}, Spec: RoleSpec{Logins: []string{bad}}}
		require.Error(t, r.CheckAndSetDefaults(), bad)
	}
}

// TestOIDCConnectorResourceFile: pctl create -f reads a connector file.
func TestOIDCConnectorResourceFile(t *testing.T) {
	kind, v, err := UnmarshalResource([]byte(`kind: oidc_connector
metadata: {name: corp}
spec:
  display: Corp
  issuer_url: https://idp.example.com
  client_id: postern
  client_secret_file: /etc/postern/oidc-secret
  scopes: [email, groups]
  claims_to_roles:
    - {claim: email, value: "*@example.com", roles: [access]}
`), "corp.yaml")
	require.NoError(t, err)
	require.Equal(t, KindOIDCConnector, kind)
	c := v.(*OIDCConnector)
	require.Equal(t, []string{"openid", "email", "groups"}, c.Spec.Scopes)
	_, _, err = UnmarshalResource([]byte("kind: oidc_connector\nmetadata: {name: corp}\nspec:\n  issuer_ulr: x\n"), "corp.yaml")
	require.ErrorContains(t, err, "corp.yaml:4")
}
