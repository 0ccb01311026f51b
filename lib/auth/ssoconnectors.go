package auth

// The oidc_connector resource through the auth server: what proxies
// show, what admins create, read (the secret stripped) and remove.

import (
	"context"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/services"
)

// GetSSOConnectors is what anyone may know of the connectors: name, type
// and display name.
func (s *Server) GetSSOConnectors(ctx context.Context) ([]authapi.SSOConnectorInfo, error) {
	cs, err := s.store.GetOIDCConnectors(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := make([]authapi.SSOConnectorInfo, 0, len(cs))
	for _, c := range cs {
		out = append(out, authapi.SSOConnectorInfo{Name: c.Metadata.Name, Type: ConnectorTypeOIDC, Display: c.Spec.Display})
	}
	return out, nil
}

// UpsertOIDCConnector creates or replaces a connector. A connector
// written without a secret (as `pctl get` printed it) keeps the stored
// one; a connector with no secret at all is refused.
func (s *Server) UpsertOIDCConnector(ctx context.Context, c *services.OIDCConnector) error {
	if c == nil {
		return trace.BadParameter("missing oidc_connector")
	}
	if err := c.CheckAndSetDefaults(); err != nil {
		return trace.Wrap(err)
	}
	if c.Spec.ClientSecret == "" && c.Spec.ClientSecretFile == "" {
		old, err := s.store.GetOIDCConnector(ctx, c.Metadata.Name)
		if err != nil && !trace.IsNotFound(err) {
			return trace.Wrap(err)
		}
		if old == nil || old.Spec.ClientSecret == "" {
			return trace.BadParameter("oidc_connector %q: set spec.client_secret_file (or spec.client_secret)", c.Metadata.Name)
		}
		c.Spec.ClientSecret = old.Spec.ClientSecret
	}
	return trace.Wrap(s.store.UpsertOIDCConnector(ctx, c))
}

// GetOIDCConnectors lists the connectors without their secrets.
func (s *Server) GetOIDCConnectors(ctx context.Context) ([]services.OIDCConnector, error) {
	cs, err := s.store.GetOIDCConnectors(ctx)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	for i := range cs {
		cs[i] = cs[i].WithoutSecrets()
	}
	return cs, nil
}

// DeleteOIDCConnector removes a connector: logins through it stop at once
// (those under way included). The users it created stay, with their
// unexpired certificates (`pctl lock --user` cuts those).
func (s *Server) DeleteOIDCConnector(ctx context.Context, name string) error {
	if err := s.store.DeleteOIDCConnector(ctx, name); err != nil {
		return trace.Wrap(err)
	}
	s.sso.mu.Lock()
	delete(s.sso.m, name)
	s.sso.mu.Unlock()
	return nil
}
