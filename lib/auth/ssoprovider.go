package auth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// The identity providers this auth server talks to: discovered once per
// connector, with their keys, and kept for a bounded time (sso.go runs the
// logins).

// ssoProviders caches one discovered provider per connector. An entry is
// used only while the connector's issuer and CA are what it was built
// from; any change rebuilds it, so an edited connector applies at the
// next login. A failed discovery is not cached: the next login tries
// again.
//
// Keys: go-oidc keeps the provider's JWKS and fetches it again only for a
// token signed by a key it does not know, so a provider's rotation to a
// new key is picked up at the first token it signs. A key the provider
// withdraws (rotated away, or compromised) would stay trusted for as long
// as the cached key set lives; so an entry lives at most maxAge, after
// which the next login discovers the provider and fetches its keys again.
type ssoProviders struct {
	// maxAge bounds an entry's life (DefaultSSOProviderMaxAge; tests
	// shorten it).
	maxAge time.Duration

	mu sync.Mutex
	m  map[string]*ssoProvider
}

// DefaultSSOProviderMaxAge is how long a discovered provider and its keys
// are reused: how late a key the provider withdrew stops being trusted
// here. An hour costs a discovery and a key fetch per connector an hour,
// and is the lifetime of a typical ID token signed just before the
// withdrawal.
const DefaultSSOProviderMaxAge = time.Hour

type ssoProvider struct {
	fingerprint string
	provider    *oidc.Provider
	client      *http.Client
	// built is when the provider was discovered (the server's clock).
	built time.Time
}

// providerFingerprint is what a cached provider depends on.
func providerFingerprint(c *services.OIDCConnector, caPEM []byte) string {
	sum := sha256.Sum256(caPEM)
	return c.Spec.IssuerURL + "\x00" + c.Spec.CAFile + "\x00" + hex.EncodeToString(sum[:])
}

// idpHTTPClient is the client for one provider: its CA alone when the
// connector names one. Keep-alives are off: a login makes three or four
// calls, and idle connections to every provider ever used are not worth
// keeping (nor their goroutines).
func idpHTTPClient(caPEM []byte) (*http.Client, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(caPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, trace.BadParameter("ca_file holds no PEM certificate")
		}
		tlsCfg.RootCAs = pool
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tlsCfg,
		DisableKeepAlives:   true,
		TLSHandshakeTimeout: idpTimeout,
		DialContext:         (&net.Dialer{Timeout: idpTimeout}).DialContext,
	}
	return &http.Client{Transport: tr, Timeout: idpTimeout}, nil
}

// oidcProvider returns the discovered provider for c.
func (s *Server) oidcProvider(ctx context.Context, c *services.OIDCConnector) (*ssoProvider, error) {
	var caPEM []byte
	if c.Spec.CAFile != "" {
		var err error
		if caPEM, err = os.ReadFile(c.Spec.CAFile); err != nil {
			return nil, trace.BadParameter("oidc_connector %q: reading ca_file: %v", c.Metadata.Name, err)
		}
	}
	fp := providerFingerprint(c, caPEM)
	s.sso.mu.Lock()
	p := s.sso.m[c.Metadata.Name]
	s.sso.mu.Unlock()
	maxAge := s.sso.maxAge
	if maxAge <= 0 {
		maxAge = DefaultSSOProviderMaxAge
	}
	if p != nil && p.fingerprint == fp && s.clock.Since(p.built) < maxAge {
		return p, nil
	}
	client, err := idpHTTPClient(caPEM)
	if err != nil {
		return nil, trace.BadParameter("oidc_connector %q: %v", c.Metadata.Name, err)
	}
	dctx, cancel := context.WithTimeout(ctx, idpTimeout)
	defer cancel()
	// go-oidc keeps this client (not the deadline) for the JWKS fetches
	// it makes later, on verification.
	provider, err := oidc.NewProvider(oidc.ClientContext(dctx, client), c.Spec.IssuerURL)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "identity provider %s did not answer: %v", c.Spec.IssuerURL, err)
	}
	p = &ssoProvider{fingerprint: fp, provider: provider, client: client, built: s.clock.Now()}
	s.sso.mu.Lock()
	if s.sso.m == nil {
		s.sso.m = map[string]*ssoProvider{}
	}
	s.sso.m[c.Metadata.Name] = p
	s.sso.mu.Unlock()
	return p, nil
}
