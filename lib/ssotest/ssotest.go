// Package ssotest starts a real OpenID Connect provider for tests: the
// example OP of github.com/zitadel/oidc (discovery, JWKS, authorization
// code flow with PKCE, userinfo, a login form), on 127.0.0.1 over TLS
// with a CA the package makes, and drives its login page the way a
// browser would. Postern's SSO is tested against it rather than against
// a mock so that what is verified (signatures by the provider's JWKS,
// issuer, audience, nonce, PKCE) is what a real provider sends.
//
// It is for tests and the e2e fixture (fixtures/oidc-op): the provider
// keeps everything in memory and its users' passwords are in the clear.
package ssotest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"golang.org/x/oauth2"
	"golang.org/x/text/language"
)

// User is a user of the provider.
type User struct {
	// Username is what the login form takes (and the preferred_username
	// claim).
	Username string `json:"username"`
	Password string `json:"password"`
	// Email is the email claim (userinfo, scope "email").
	Email     string `json:"email"`
	FirstName string `json:"first_name,omitempty"`
	LastName  string `json:"last_name,omitempty"`
}

// DefaultUsers are the provider's users when Config.Users is empty.
var DefaultUsers = []User{
	{Username: "alice", Password: "verysecure", Email: "alice@example.com", FirstName: "Alice", LastName: "Example"},
	{Username: "mallory", Password: "verysecure", Email: "mallory@elsewhere.test", FirstName: "Mallory", LastName: "Elsewhere"},
}

// Config configures a Provider.
type Config struct {
	// Dir is where the CA file is written; required (t.TempDir()).
	Dir string
	// RedirectURLs are the client's registered redirect URIs; required.
	RedirectURLs []string
	// ClientID defaults to "postern"; ClientSecret to a random one.
	ClientID     string
	ClientSecret string
	// Users default to DefaultUsers.
	Users []User
	// Addr is the listen address, default 127.0.0.1:0.
	Addr string
}

// CheckAndSetDefaults validates the config.
func (c *Config) CheckAndSetDefaults() error {
	if c.Dir == "" {
		return errors.New("ssotest: missing Dir")
	}
	if len(c.RedirectURLs) == 0 {
		return errors.New("ssotest: missing RedirectURLs")
	}
	if c.ClientID == "" {
		c.ClientID = "postern"
	}
	if c.ClientSecret == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		c.ClientSecret = base64.RawURLEncoding.EncodeToString(b[:])
	}
	if len(c.Users) == 0 {
		c.Users = DefaultUsers
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	return nil
}

// Provider is a running OpenID provider.
type Provider struct {
	// Issuer is https://127.0.0.1:PORT (the connector's issuer_url).
	Issuer string
	// CAFile is the PEM file of the CA of the provider's TLS certificate
	// (the connector's ca_file); CAPEM its contents.
	CAFile string
	CAPEM  []byte
	// ClientID and ClientSecret are the registered client's.
	ClientID     string
	ClientSecret string
	// RedirectURLs are the client's registered redirect URIs.
	RedirectURLs []string

	srv  *httptest.Server
	pool *x509.CertPool

	// keys sign the provider's tokens (RotateKey).
	keys *rotatingKeys

	mu      sync.Mutex
	rewrite func(idToken string) string
	// keyFetches counts requests for the provider's JWKS.
	keyFetches int
}

// KeyFetches is how many times the provider's JWKS was fetched: a relying
// party that caches keys fetches it once per key it has not seen.
func (p *Provider) KeyFetches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keyFetches
}

// Start starts a provider; Close stops it.
func Start(cfg Config) (*Provider, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	caPEM, serverCert, err := makeTLS()
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	caFile := filepath.Join(cfg.Dir, "oidc-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	p := &Provider{
		Issuer:       "https://" + l.Addr().String(),
		CAFile:       caFile,
		CAPEM:        caPEM,
		ClientID:     cfg.ClientID,
		ClientSecret: cfg.ClientSecret,
		RedirectURLs: cfg.RedirectURLs,
		pool:         pool,
	}
	users := userStore{}
	for i, u := range cfg.Users {
		id := fmt.Sprintf("id%d", i+1)
		users[id] = &storage.User{
			ID: id, Username: u.Username, Password: u.Password, Email: u.Email, EmailVerified: true,
			FirstName: u.FirstName, LastName: u.LastName, PreferredLanguage: language.English,
		}
	}
	// A client map of this provider's own: storage.RegisterClients
	// writes a package-wide map, which two providers in one test would
	// share.
	clients := map[string]*storage.Client{cfg.ClientID: storage.WebClient(cfg.ClientID, cfg.ClientSecret, cfg.RedirectURLs...)}
	st, err := newRotatingKeys(storage.NewStorageWithClients(users, clients))
	if err != nil {
		l.Close()
		return nil, err
	}
	p.keys = st
	router := exampleop.SetupServer(p.Issuer+"/", st, nil, false)
	srv := httptest.NewUnstartedServer(p.wrap(router))
	srv.Listener.Close()
	srv.Listener = l
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	p.srv = srv
	// The example OP's issuer has a trailing slash; tokens carry it.
	p.Issuer += "/"
	return p, nil
}

// Close stops the provider.
func (p *Provider) Close() { p.srv.Close() }

// HTTPClient is a client that trusts the provider's CA, with a cookie
// jar, that does not follow redirects (Login follows them itself).
func (p *Provider) HTTPClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{
		Jar:       jar,
		Timeout:   15 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.pool}, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// RewriteIDTokens makes the token endpoint answer f(id_token) in place of
// each ID token it issues (nil: stop): how tests hand the relying party
// a forged, unsigned, foreign or otherwise wrong token through the real
// code exchange.
func (p *Provider) RewriteIDTokens(f func(idToken string) string) {
	p.mu.Lock()
	p.rewrite = f
	p.mu.Unlock()
}

// wrap applies RewriteIDTokens to the token endpoint's answers.
func (p *Provider) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		f := p.rewrite
		if r.URL.Path == "/keys" {
			p.keyFetches++
		}
		p.mu.Unlock()
		if f == nil || r.URL.Path != "/oauth/token" {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		var m map[string]any
		if rec.Code == http.StatusOK && json.Unmarshal(body, &m) == nil {
			if tok, ok := m["id_token"].(string); ok {
				m["id_token"] = f(tok)
				body, _ = json.Marshal(m)
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	})
}

var (
	formActionRe = regexp.MustCompile(`<form[^>]*action="([^"]+)"`)
	hiddenIDRe   = regexp.MustCompile(`name="id" value="([^"]*)"`)
)

// Login performs the provider's login steps for authURL (what the
// relying party answered) as a browser would: GET the authorization URL,
// follow to the login form, POST username and password, and follow the
// redirects up to (not into) the authorization request's redirect_uri.
// It returns the raw query the provider sent the browser back with
// (code and state, or error). A wrong password is an error naming the
// form's complaint.
func (p *Provider) Login(ctx context.Context, authURL, username, password string) (string, error) {
	au, err := url.Parse(authURL)
	if err != nil {
		return "", err
	}
	redirect := au.Query().Get("redirect_uri")
	if redirect == "" {
		return "", errors.New("ssotest: the authorization URL has no redirect_uri")
	}
	c := p.HTTPClient()
	next, method, form := authURL, http.MethodGet, url.Values(nil)
	for range 20 {
		if strings.HasPrefix(next, redirect) {
			u, err := url.Parse(next)
			if err != nil {
				return "", err
			}
			return u.RawQuery, nil
		}
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequestWithContext(ctx, method, next, body)
		if err != nil {
			return "", err
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		page, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		base := resp.Request.URL
		switch {
		case resp.StatusCode >= 300 && resp.StatusCode < 400:
			loc, err := base.Parse(resp.Header.Get("Location"))
			if err != nil {
				return "", err
			}
			next, method, form = loc.String(), http.MethodGet, nil
		case resp.StatusCode == http.StatusOK && formActionRe.Match(page):
			if form != nil {
				return "", fmt.Errorf("ssotest: login refused: %s", formError(page))
			}
			action, err := base.Parse(string(formActionRe.FindSubmatch(page)[1]))
			if err != nil {
				return "", err
			}
			id := ""
			if m := hiddenIDRe.FindSubmatch(page); m != nil {
				id = string(m[1])
			}
			next, method = action.String(), http.MethodPost
			form = url.Values{"id": {id}, "username": {username}, "password": {password}}
		default:
			return "", fmt.Errorf("ssotest: %s %s answered %d: %s", method, next, resp.StatusCode, bytes.TrimSpace(page))
		}
	}
	return "", errors.New("ssotest: too many redirects")
}

var formErrorRe = regexp.MustCompile(`<p style="color:red[^"]*">([^<]*)</p>`)

func formError(page []byte) string {
	if m := formErrorRe.FindSubmatch(page); m != nil && len(bytes.TrimSpace(m[1])) > 0 {
		return string(bytes.TrimSpace(m[1]))
	}
	return "the login form came back"
}

// IDToken runs a whole authorization code flow of the registered client
// against this provider (redirect to RedirectURLs[0], with nonce) and
// returns the raw ID token it issued: a genuine token of this provider,
// for tests that present it where it does not belong.
func (p *Provider) IDToken(ctx context.Context, username, password, nonce string) (string, error) {
	cfg := &oauth2.Config{
		ClientID: p.ClientID, ClientSecret: p.ClientSecret, RedirectURL: p.RedirectURLs[0],
		Endpoint: oauth2.Endpoint{AuthURL: p.Issuer + "auth", TokenURL: p.Issuer + "oauth/token"},
		Scopes:   []string{"openid", "email", "profile"},
	}
	verifier := oauth2.GenerateVerifier()
	authURL := cfg.AuthCodeURL("ssotest-state", oauth2.SetAuthURLParam("nonce", nonce), oauth2.S256ChallengeOption(verifier))
	q, err := p.Login(ctx, authURL, username, password)
	if err != nil {
		return "", err
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return "", err
	}
	hc := p.HTTPClient()
	hc.CheckRedirect = nil
	tok, err := cfg.Exchange(context.WithValue(ctx, oauth2.HTTPClient, hc), vals.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		return "", err
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return "", errors.New("ssotest: no id_token")
	}
	return raw, nil
}

// userStore is the provider's users, by ID.
type userStore map[string]*storage.User

func (u userStore) GetUserByID(id string) *storage.User { return u[id] }

func (u userStore) GetUserByUsername(name string) *storage.User {
	for _, user := range u {
		if user.Username == name {
			return user
		}
	}
	return nil
}

// ExampleClientID names the example's JWT-profile service client, unused.
func (userStore) ExampleClientID() string { return "service" }

// makeTLS makes a CA and a server certificate for 127.0.0.1, ::1 and
// localhost signed by it.
func makeTLS() (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ssotest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, cert, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
