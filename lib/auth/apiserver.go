package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/api"
	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/observe"
)

// Server names a client puts in its TLS ClientHello (SNI).
const (
	// AuthServerName is the name clients verify the auth server's
	// certificate against, whatever address they dialed: the certificate
	// always carries it, so a node that reaches auth through NAT or a DNS
	// name nobody told auth about still verifies it. Pinning a fixed name is
	// safe because only the auth server's certificate has the server-auth
	// key usage; node, proxy and admin certificates are client-only.
	AuthServerName = "auth.postern"
	// JoinServerName selects the join listener: no client certificate is
	// asked for, and only the join endpoint is served (the token is the
	// credential there).
	JoinServerName = "join.postern"
)

// maxRequestBody bounds request bodies; the largest legitimate one (a role
// or a join request) is a few kilobytes.
const maxRequestBody = 1 << 20

// APIConfig configures the auth API server.
type APIConfig struct {
	// Auth is the auth server the API exposes; required.
	Auth *Server
	// Listener is where to serve (plain TCP: TLS is added here); required.
	Listener net.Listener
	// RequestTimeout bounds each API call's handler (streams excepted);
	// zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Deps: Logger (component auth:api); the rest unused.
	observe.Deps
}

// DefaultRequestTimeout bounds one API call on the server side. It must be
// shorter than DefaultClientTimeout: when the backend stops answering (etcd
// down, say), its client calls would otherwise wait for as long as the
// request's context lives, and the caller would only see its own timeout
// ("context deadline exceeded") instead of the server saying that the
// backend is unavailable.
const DefaultRequestTimeout = DefaultClientTimeout / 2

// CheckAndSetDefaults validates the config.
func (c *APIConfig) CheckAndSetDefaults() error {
	if c.Auth == nil {
		return trace.BadParameter("auth API: missing Auth")
	}
	if c.Listener == nil {
		return trace.BadParameter("auth API: missing Listener")
	}
	c.Deps.SetDefaults(observe.ComponentAuthAPI)
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	return nil
}

// APIServer serves the auth API over mutual TLS.
//
// Why one port with two TLS personalities (chosen per connection by
// GetConfigForClient on the ClientHello's server name): a joining host has
// no certificate yet, so something must accept it without one, yet every
// other endpoint must be unreachable to anyone without a cluster
// certificate. Connections that ask for JoinServerName get a TLS config that
// requests no client certificate and a handler that serves the join
// endpoint and nothing else; every other connection must present a client
// certificate signed by the cluster's TLS CA (tls.RequireAndVerifyClientCert)
// or the handshake fails, so an unauthenticated peer never reaches a
// handler. Dispatch uses the server name negotiated for the connection
// (r.TLS.ServerName), never the Host header, so a join connection cannot be
// steered to another handler. Authorization then comes from the verified
// certificate's role (O) and ID (CN), per endpoint.
type APIServer struct {
	cfg  APIConfig
	auth *Server
	log  logrus.FieldLogger
	srv  *http.Server

	mainMux *http.ServeMux
	joinMux *http.ServeMux
	// relayLn serves the joins proxies relay (joinrelay.go) as join
	// connections from the clients' own addresses.
	relayLn *relayListener
	// localLn serves this process's own host roles (inproc.go).
	localLn *relayListener
	// routes is every endpoint registered, in order (set up once by
	// registerRoutes, read-only afterwards).
	routes []apiRoute

	// closing is closed when Close or Shutdown starts; long-lived handlers
	// (watches) return on it.
	closing   chan struct{}
	closeOnce sync.Once
	// keepAlive is how often watch streams are pinged; zero means
	// DefaultWatchKeepAlive (tests shorten it).
	keepAlive time.Duration

	// mu guards closed and the Add side of handlers: no handler may start
	// once closed is set, so handlers.Wait in Close does not race with Add.
	mu       sync.Mutex
	closed   bool
	handlers sync.WaitGroup
}

// NewAPIServer builds the API server and its TLS certificate (SANs: the
// listener's IPs, loopback, localhost, the host name, AuthServerName,
// JoinServerName and the auth server's PublicAddrs). Call Serve to run it.
func NewAPIServer(cfg APIConfig) (*APIServer, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	a := &APIServer{
		cfg:     cfg,
		auth:    cfg.Auth,
		log:     cfg.Logger,
		closing: make(chan struct{}),
	}
	dnsNames, ips := serverSANs(cfg.Listener.Addr(), cfg.Auth.cfg.PublicAddrs)
	// Construction, before any request: the API server's own identity.
	id, err := cfg.Auth.issueIdentity(context.Background(), IdentityRequest{
		ID: AuthIdentityID, Role: RoleAuth, Hostname: AuthServerName,
	}, dnsNames, ips)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	// Send the CA along with the leaf: a joining host has nothing else to
	// check the pin against.
	serverCert := id.TLSCert
	serverCert.Certificate = append(slices.Clone(serverCert.Certificate), cfg.Auth.tlsCACert.Raw)

	clock := cfg.Auth.clock
	mainTLS := &tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    cfg.Auth.tlsCAPool(),
		MinVersion:   tls.VersionTLS12,
		Time:         clock.Now,
		// No resumption: every connection proves its certificate afresh,
		// so a session from the join personality (no certificate) can
		// never be resumed into this one.
		SessionTicketsDisabled: true,
		// Refuse, during the handshake, a certificate from this CA that
		// is not a well-formed identity of this cluster.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 {
				return errors.New("no verified client certificate")
			}
			_, err := a.peerFromCert(cs.VerifiedChains[0][0])
			return err
		},
	}
	joinTLS := &tls.Config{
		Certificates:           []tls.Certificate{serverCert},
		ClientAuth:             tls.NoClientCert,
		MinVersion:             tls.VersionTLS12,
		Time:                   clock.Now,
		SessionTicketsDisabled: true,
	}
	base := &tls.Config{
		MinVersion:             tls.VersionTLS12,
		SessionTicketsDisabled: true,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			if hello.ServerName == JoinServerName {
				return joinTLS, nil
			}
			return mainTLS, nil
		},
	}

	a.mainMux = http.NewServeMux()
	a.joinMux = http.NewServeMux()
	a.relayLn = newRelayListener(cfg.Listener.Addr())
	a.localLn = newRelayListener(cfg.Listener.Addr())
	a.registerRoutes()
	a.srv = &http.Server{
		Handler:           http.HandlerFunc(a.serveHTTP),
		TLSConfig:         base,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          log.New(&logWriter{log: a.log}, "", 0),
	}
	return a, nil
}

// Addr is the address the API listens on.
func (a *APIServer) Addr() net.Addr { return a.cfg.Listener.Addr() }

// Serve serves until Close or Shutdown; it returns nil then.
func (a *APIServer) Serve() error {
	var side sync.WaitGroup
	for _, ln := range []net.Listener{a.relayLn, a.localLn} {
		side.Add(1)
		go func() {
			defer side.Done()
			_ = a.srv.Serve(tls.NewListener(ln, a.srv.TLSConfig))
		}()
	}
	err := a.srv.Serve(tls.NewListener(a.cfg.Listener, a.srv.TLSConfig))
	a.relayLn.Close()
	a.localLn.Close()
	side.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return trace.Wrap(err)
}

// Close stops the server at once: listener and connections closed,
// watches ended. It waits for running handlers to return.
func (a *APIServer) Close() error {
	a.stopHandlers()
	err := a.srv.Close()
	// Serve may not have run yet; the listener is ours to close either way.
	a.cfg.Listener.Close()
	a.handlers.Wait()
	return trace.Wrap(err)
}

// Shutdown stops accepting, ends watches, and waits (bounded by ctx) for
// in-flight requests to finish.
//
// Why in this order: http.Server.Shutdown closes the listener and the idle
// kept-alive connections at once, and closes each busy one after its
// answer (which says "Connection: close"). A request that arrives on a
// kept-alive connection before that is served in full: refusing it (as
// Close does) would fail a call that had already left the client, which
// can repeat only idempotent ones. Watches end first (their streams would
// hold Shutdown until ctx ends; a watch asked for meanwhile is refused as
// going away), and the closed flag is only set once the server no longer
// reads requests, so that handlers.Wait does not race with a late Add.
func (a *APIServer) Shutdown(ctx context.Context) error {
	a.endStreams()
	err := a.srv.Shutdown(ctx)
	if err != nil {
		a.srv.Close()
	}
	a.stopHandlers()
	a.handlers.Wait()
	return trace.Wrap(err)
}

// endStreams ends watches, the join relay and in-process dials (the
// host roles of this process have shut down before auth), and refuses new
// watches.
func (a *APIServer) endStreams() {
	a.closeOnce.Do(func() { close(a.closing) })
	a.relayLn.Close()
	a.localLn.Close()
}

func (a *APIServer) stopHandlers() {
	a.endStreams()
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
}

// shuttingDown reports whether Close or Shutdown has started.
func (a *APIServer) shuttingDown() bool {
	select {
	case <-a.closing:
		return true
	default:
		return false
	}
}

// writeGoingAway refuses a request, without running its handler, because
// the server is stopping: the header tells the client that the call did
// not run and may go to another auth server (failover.go), whatever it is.
func writeGoingAway(w http.ResponseWriter) {
	w.Header().Set(headerGoingAway, "1")
	w.Header().Set("Connection", "close")
	writeError(w, trace.ConnectionProblem(nil, "auth API is shutting down"))
}

// serveHTTP dispatches on the connection's negotiated server name.
func (a *APIServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		writeGoingAway(w)
		return
	}
	a.handlers.Add(1)
	a.mu.Unlock()
	defer a.handlers.Done()

	if r.TLS == nil {
		writeError(w, trace.AccessDenied("TLS required"))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	if r.TLS.ServerName == JoinServerName {
		a.joinMux.ServeHTTP(w, r)
		return
	}
	a.mainMux.ServeHTTP(w, r)
}

// peer is the verified caller of a request.
type peer struct {
	ID   string
	Role string
}

// peerFromCert reads the identity out of a verified client certificate.
func (a *APIServer) peerFromCert(cert *x509.Certificate) (*peer, error) {
	s := cert.Subject
	if s.CommonName == "" || len(s.Organization) != 1 || len(s.OrganizationalUnit) != 1 {
		return nil, trace.AccessDenied("client certificate is not a Postern identity")
	}
	if s.OrganizationalUnit[0] != a.auth.cfg.ClusterName {
		return nil, trace.AccessDenied("client certificate is for cluster %q, not %q", s.OrganizationalUnit[0], a.auth.cfg.ClusterName)
	}
	switch s.Organization[0] {
	case RoleAuth, RoleNode, RoleProxy, RoleAdmin:
	default:
		return nil, trace.AccessDenied("client certificate has unknown role %q", s.Organization[0])
	}
	return &peer{ID: s.CommonName, Role: s.Organization[0]}, nil
}

// allow lists the system roles that may call one endpoint (a row of the
// table in registerRoutes). Deny by default: a role not listed is refused
// with 403 before the handler runs. RoleAuth is in no row: the auth
// server's own identity serves the API and never calls it, so a stolen
// copy of it buys nothing here either.
func allow(roles ...string) []string { return roles }

// apiRoute is one registered endpoint and the roles allowed to call it;
// roles is nil for the join endpoint, which takes no client certificate.
// The list exists so that the policy can be read back (and tested,
// endpoint by endpoint) exactly as it was registered.
type apiRoute struct {
	pattern string
	roles   []string
}

// apiHandler handles one request for an authorized peer and returns the
// value to send as JSON (nil sends {}).
type apiHandler func(ctx context.Context, p *peer, r *http.Request) (any, error)

// handle registers an endpoint on the main mux. The role check runs before
// the handler, from the certificate verified in the handshake.
func (a *APIServer) handle(pattern string, roles []string, h apiHandler) {
	a.routes = append(a.routes, apiRoute{pattern: pattern, roles: roles})
	a.mainMux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.VerifiedChains) == 0 {
			writeError(w, trace.AccessDenied("client certificate required"))
			return
		}
		p, err := a.peerFromCert(r.TLS.VerifiedChains[0][0])
		if err != nil {
			writeError(w, err)
			return
		}
		if !slices.Contains(roles, p.Role) {
			a.log.WithFields(logrus.Fields{"peer": p.ID, "role": p.Role, "endpoint": pattern}).Warn("Denied API call.")
			err := trace.AccessDenied("role %q may not call %s", p.Role, pattern)
			a.emitAPIDenied(r.Context(), p, r, pattern, err, nil)
			writeError(w, err)
			return
		}
		a.respond(w, r, p, h)
	})
}

func (a *APIServer) respond(w http.ResponseWriter, r *http.Request, p *peer, h apiHandler) {
	// Streams only return a marker here and run below on r's own context,
	// so the bound covers plain calls only. It is a real-time I/O bound,
	// like the client's (not the injected clock: a fake clock would never
	// fire it, and tests counting its waiters would see stray timers).
	ctx, cancel := context.WithTimeout(r.Context(), a.cfg.RequestTimeout)
	out, err := h(ctx, p, r)
	timedOut := ctx.Err() == context.DeadlineExceeded && r.Context().Err() == nil
	cancel()
	if err != nil {
		switch {
		case timedOut && !trace.IsConnectionProblem(err):
			err = trace.ConnectionProblem(err, "the auth server's backend is unavailable: the request did not complete within %v", a.cfg.RequestTimeout)
		case trace.IsConnectionProblem(err):
			// Handlers reach nothing but the backend (and the audit
			// log on it): a connection problem is the backend's. Say so,
			// so that pctl, psh and the proxy's logs name the culprit.
			a.log.WithError(err).WithField("path", r.URL.Path).Warn("API call failed: the backend is unavailable.")
			err = trace.ConnectionProblem(err, "the auth server's backend is unavailable: %s", trace.UserMessage(err))
		}
		if _, status := authapi.ErrorKind(err); status == http.StatusInternalServerError {
			a.log.WithError(err).WithField("path", r.URL.Path).Warn("API call failed.")
		}
		writeError(w, err)
		return
	}
	if m, ok := out.(streamMarker); ok {
		m.h(w, r, m.p)
		return
	}
	if out == nil {
		out = struct{}{}
	}
	writeJSON(w, http.StatusOK, out)
}

// readJSON decodes the request body into v with the one strict decoder
// (api.ReadJSON): unknown fields, trailing data, an empty body and one over
// maxRequestBody are refused, so a client typo is an error instead of a
// silently ignored setting.
func readJSON(r *http.Request, v any) error {
	return trace.Wrap(api.ReadJSON(r.Body, maxRequestBody, v))
}

// serverSANs lists the names and IPs the auth server's certificate covers.
func serverSANs(listenAddr net.Addr, publicAddrs []string) ([]string, []net.IP) {
	dnsNames := []string{AuthServerName, JoinServerName, "localhost"}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	addIP := func(ip net.IP) {
		for _, have := range ips {
			if have.Equal(ip) {
				return
			}
		}
		ips = append(ips, ip)
	}
	addHost := func(h string) {
		if h == "" {
			return
		}
		if ip := net.ParseIP(h); ip != nil {
			addIP(ip)
			return
		}
		if !slices.Contains(dnsNames, h) {
			dnsNames = append(dnsNames, h)
		}
	}
	if hostname, err := os.Hostname(); err == nil {
		addHost(hostname)
	}
	if tcp, ok := listenAddr.(*net.TCPAddr); ok {
		if tcp.IP.IsUnspecified() {
			// Listening on every interface: cover every address we have.
			if addrs, err := net.InterfaceAddrs(); err == nil {
				for _, addr := range addrs {
					if ipn, ok := addr.(*net.IPNet); ok {
						addIP(ipn.IP)
					}
				}
			}
		} else {
			addIP(tcp.IP)
		}
	}
	for _, pa := range publicAddrs {
		h := pa
		if host, _, err := net.SplitHostPort(pa); err == nil {
			h = host
		}
		addHost(h)
	}
	return dnsNames, ips
}

// logWriter sends net/http's own error log (TLS handshake failures, mostly
// peers without a certificate) to logrus at debug level: they are the
// expected result of an unauthenticated caller, not server faults.
type logWriter struct{ log logrus.FieldLogger }

func (w *logWriter) Write(p []byte) (int, error) {
	w.log.Debug(string(p))
	return len(p), nil
}
