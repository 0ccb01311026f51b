// Package web is the proxy's HTTPS port: the web API (CLI login, web
// sessions, the terminal websocket) and the embedded UI. This file holds
// the server shell and the discovery endpoint; the login and terminal
// endpoints are added by their own files.
package web

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/sshalgo"
	"github.com/postern-dev/postern/lib/version"
)

// Config configures the web server.
type Config struct {
	// ClusterName is reported by /webapi/ping; required.
	ClusterName string
	// ProxySSHAddr is the proxy SSH address clients should dial, as
	// reported by /webapi/ping; required.
	ProxySSHAddr string
	// Certificate is the TLS pair of the port; required.
	Certificate tls.Certificate
	// Auth logs users in for POST /webapi/ssh/certs; nil means the
	// endpoint answers 501 (a web server without login).
	Auth SSHLoginAuthenticator
	// SecondFactor reports the cluster's second factor for /webapi/ping:
	// "otp" or "off". Nil means "off". It is called on every ping, so it
	// must be cheap (the service caches its answer).
	SecondFactor func(ctx context.Context) string
	// WebSessions enables browser sessions, GET /webapi/nodes and the
	// terminal websocket (routes.go); the zero value disables them.
	WebSessions WebSessionsConfig
	// JoinRelay, when set, dials the auth API for hosts that join
	// through this proxy (joinrelay.go), naming the joining client's
	// address (auth counts failed joins per client); nil means no relay.
	JoinRelay func(ctx context.Context, clientAddr string) (net.Conn, error)
	// PublicWebAddrs are the HOST[:PORT] addresses browsers reach this
	// web port at, the preferred one first (public_addrs, then the
	// listener's own names): a single sign-on login's redirect URI is
	// the callback at the one the request came in on, else the first
	// (sso.go). Empty means the listener's address.
	PublicWebAddrs []string
	// TunnelAddr is the proxy's reverse tunnel address reported by
	// /webapi/ping; empty when it takes no tunnels.
	TunnelAddr string
	// SSHAlgorithms are what the web terminal offers the nodes it dials;
	// an empty list means sshalgo's default one.
	SSHAlgorithms sshalgo.Lists
	// Deps: Clock, Logger; Tracer starts a span per web request, the
	// parent of what the request routes and dials (the web terminal).
	observe.Deps
}

// CheckAndSetDefaults validates the config.
func (c *Config) CheckAndSetDefaults() error {
	if c.ClusterName == "" {
		return trace.BadParameter("web: missing ClusterName")
	}
	if c.ProxySSHAddr == "" {
		return trace.BadParameter("web: missing ProxySSHAddr")
	}
	if len(c.Certificate.Certificate) == 0 {
		return trace.BadParameter("web: missing Certificate")
	}
	c.Deps.SetDefaults(observe.ComponentWeb)
	return nil
}

// Server is the HTTPS server.
type Server struct {
	cfg Config
	srv *http.Server
	// web is the browser sessions' and terminals' state (routes.go).
	web *webState
	// joinRelay relays joins to auth (joinrelay.go); nil without one.
	joinRelay *joinRelay
	// connectorCache keeps the single sign-on connectors that
	// /webapi/ping lists (sso.go).
	connectorCache connectorCache
	// listenAddr is the address Serve listens on (a string), the
	// fallback of PublicWebAddrs.
	listenAddr atomic.Value
}

// Timeouts of the HTTP server: a peer that trickles headers or never reads
// its response must not hold a connection forever.
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
)

// NewServer builds the server.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	s := &Server{cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /webapi/ping", s.ping)
	mux.HandleFunc("POST /webapi/ssh/certs", s.sshCerts)
	if cfg.JoinRelay != nil {
		s.joinRelay = newJoinRelay(cfg.JoinRelay)
	}
	mux.HandleFunc("GET "+JoinRelayPath, s.serveJoinRelay)
	mux.HandleFunc("GET "+ssoWebLoginPath, s.ssoWebLogin)
	mux.HandleFunc("POST "+ssoConsoleLoginPth, s.ssoConsoleLogin)
	mux.HandleFunc("GET "+SSOCallbackPath, s.ssoCallback)
	if err := s.registerWebRoutes(mux); err != nil {
		return nil, trace.Wrap(err)
	}
	s.srv = &http.Server{
		Handler:           traced(s.cfg.Tracer, securityHeaders(mux)),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cfg.Certificate},
			MinVersion:   tls.VersionTLS12,
		},
		ErrorLog: nil,
	}
	return s, nil
}

func (s *Server) ping(w http.ResponseWriter, r *http.Request) {
	secondFactor := webapi.SecondFactorOff
	if s.cfg.SecondFactor != nil {
		secondFactor = s.cfg.SecondFactor(r.Context())
	}
	writeJSON(w, http.StatusOK, webapi.PingResponse{
		ClusterName:   s.cfg.ClusterName,
		ProxySSHAddr:  s.cfg.ProxySSHAddr,
		TunnelAddr:    s.cfg.TunnelAddr,
		SecondFactor:  secondFactor,
		ServerVersion: version.Version,
		Connectors:    s.connectors(r.Context()),
	})
}

// securityHeaders sets the headers every response carries.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Strict-Transport-Security", "max-age=31536000")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		next.ServeHTTP(w, r)
	})
}

// Serve serves HTTPS on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.listenAddr.Store(ln.Addr().String())
	err := s.srv.ServeTLS(ln, "", "")
	if err == http.ErrServerClosed {
		return nil
	}
	return trace.Wrap(err)
}

// Shutdown stops accepting and waits for requests to finish until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	// Terminals are hijacked websockets that srv.Shutdown does not wait for.
	return trace.NewAggregate(err, s.web.shutdown(ctx, s.cfg.Clock), s.joinRelay.shutdown(ctx))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
