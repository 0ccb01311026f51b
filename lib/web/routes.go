package web

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/utils"
)

// HostDialer routes and dials a node: *proxy.Router. The web terminal uses
// the very Router object the proxy's SSH port uses, in-process, so both
// paths give the same answer and nothing dials the proxy's own port.
type HostDialer interface {
	DialHost(ctx context.Context, req proxy.RouteRequest) (net.Conn, proxy.Route, error)
}

var _ HostDialer = (*proxy.Router)(nil)

// WebSessionsConfig configures browser sessions, the node list and the
// terminal. A zero value (no Router) disables them: those endpoints
// answer 501, and only the UI's static files and the CLI login remain.
type WebSessionsConfig struct {
	// Router dials nodes for the terminal; required to enable sessions.
	Router HostDialer
	// Nodes lists nodes for GET /webapi/nodes; required with Router.
	Nodes authz.NodeLister
	// Roles fetches the session user's roles live for RBAC (the store or
	// the auth client); required with Router.
	Roles authz.RoleGetter
	// Store keeps session records; nil means an in-memory store (a proxy
	// whose auth server is remote: see MemorySessionStore).
	Store SessionStore
	// IdleTTL ends a session unused for this long; zero means
	// DefaultSessionIdleTTL.
	IdleTTL time.Duration
	// TTL is the absolute lifetime; zero means DefaultSessionTTL.
	TTL time.Duration
	// KeepAliveInterval is how often a terminal pings its browser, and how
	// long it waits for the answer; zero means DefaultKeepAliveInterval.
	KeepAliveInterval time.Duration
	// AccessRequests serves /webapi/requests (requests.go); nil answers
	// 501.
	AccessRequests AccessRequestAPI
	// Locks refuses and ends the sessions of locked (and deleted) users
	// (locks.go); nil means no locks. The service always sets it.
	Locks LockChecker
	// Audit receives the terminal's refusals (access.denied) and
	// ambiguous targets (route.ambiguous); nil means events.Discard.
	Audit events.Emitter
	// NodeKeepAlive probes a terminal's SSH connection to its node
	// (keepalive@openssh.com): a frozen node ends the terminal with a
	// clear message instead of hanging it. Zero means every 10s, given up
	// after 3 unanswered; a nil Clock means the server's.
	NodeKeepAlive utils.SSHKeepAliveConfig
	// TerminalGrace is how long a terminal whose websocket went away
	// waits for a resume (web_terminal_grace); zero means
	// DefaultTerminalGrace, negative means none (the terminal ends with
	// its socket, the behaviour before resume existed).
	TerminalGrace time.Duration
	// Certs, when set, lets this proxy serve sessions created on another
	// proxy (sessionshared.go); nil means only its own.
	Certs WebSessionCertifier
	// Watch, when set, streams changes of the session records, so that a
	// logout on any proxy ends the session's terminals on this one.
	Watch SessionWatch
	// Recordings serves /webapi/recordings* (recordings.go); nil means
	// those endpoints answer 501.
	Recordings RecordingSource
	// Clusters, when set, lists the clusters a session user may reach
	// (GET /webapi/clusters) and a leaf cluster's nodes
	// (GET /webapi/nodes?cluster=LEAF): the proxy's Router. Nil means
	// the local cluster only.
	Clusters ClusterRouter
	// LeafHostCAs returns the host CA keys stored for leaf cluster name
	// at the trust exchange: a terminal to a leaf node checks the node's
	// host certificate against them, for the principal NAME.LEAF only.
	// Nil means no terminals to leaf clusters.
	LeafHostCAs func(ctx context.Context, cluster string) ([]ssh.PublicKey, error)
	// Recorder records the terminals to OpenSSH nodes (terminal_record.go);
	// nil means they are not recorded, and a role that requires recording
	// refuses them.
	Recorder *TerminalRecorder
}

func (c *WebSessionsConfig) enabled() bool { return c.Router != nil }

func (c *WebSessionsConfig) checkAndSetDefaults(now func() time.Time) error {
	if !c.enabled() {
		return nil
	}
	if c.Nodes == nil {
		return trace.BadParameter("web: WebSessions.Router is set but Nodes is missing")
	}
	if err := c.Recorder.check(); err != nil {
		return trace.Wrap(err)
	}
	if c.Roles == nil {
		return trace.BadParameter("web: WebSessions.Router is set but Roles is missing")
	}
	if c.Store == nil {
		c.Store = NewMemorySessionStore(now)
	}
	if c.IdleTTL <= 0 {
		c.IdleTTL = DefaultSessionIdleTTL
	}
	if c.TTL <= 0 {
		c.TTL = DefaultSessionTTL
	}
	if c.KeepAliveInterval <= 0 {
		c.KeepAliveInterval = DefaultKeepAliveInterval
	}
	if c.Audit == nil {
		c.Audit = events.Discard
	}
	if c.TerminalGrace == 0 {
		c.TerminalGrace = DefaultTerminalGrace
	}
	return nil
}

// webState is the server's browser-facing state: live sessions and the
// running terminals, which outlive their HTTP request (the websocket is
// hijacked, so http.Server.Shutdown does not wait for them).
type webState struct {
	ctx      context.Context
	cancel   context.CancelFunc
	sessions sessionRegistry
	// terms owns the terminals, attached and detached.
	terms termRegistry
	// mu guards closed and orders wg.Add against shutdown's wg.Wait.
	mu        sync.Mutex
	closed    bool
	terminals sync.WaitGroup
	// locksDone is closed when enforceLocks returns (nil without Locks).
	locksDone chan struct{}
	// watchDone is closed when watchSessions returns (nil without Watch).
	watchDone chan struct{}
	// recIndex caches recordings' seek indexes (recordings.go).
	recIndex recIndexCache
}

// track registers a running terminal; false after shutdown began.
func (w *webState) track() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.terminals.Add(1)
	return true
}

// shutdown drains the terminals like the SSH port drains its sessions
// (SIGTERM, shutdown_grace): new terminals are refused at once, detached
// ones end at once (this proxy's port is closed, so nobody can resume
// them here), and attached ones go on until they end or ctx ends. Then
// what is left is closed with errShutdownGrace, told to the browser as
// the terminal's error frame, and the web sessions' watchers stop. The
// server's context is canceled only after the closing frames were
// written (it carries every websocket read and write).
func (w *webState) shutdown(ctx context.Context, clock clockwork.Clock) error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.terms.drain(errShuttingDown)
	terminalsDone := make(chan struct{})
	go func() {
		w.terminals.Wait()
		close(terminalsDone)
	}()
	var err error
	select {
	case <-terminalsDone:
	case <-ctx.Done():
		err = trace.Wrap(ctx.Err())
		w.terms.closeAll(errShutdownGrace)
		// The closing frames take a moment to be written; a browser that
		// does not read them does not hold the process.
		timer := clock.NewTimer(closeFrameWait)
		select {
		case <-terminalsDone:
		case <-timer.Chan():
		}
		timer.Stop()
	}
	w.sessions.closeAll()
	w.cancel()
	if w.locksDone != nil {
		<-w.locksDone
	}
	if w.watchDone != nil {
		<-w.watchDone
	}
	return err
}

// closeFrameWait bounds how long shutdown waits, past the grace, for the
// closed terminals to tell their browsers why.
const closeFrameWait = 2 * time.Second

// registerWebRoutes adds the browser endpoints and the UI to mux. It is
// the one call NewServer makes into this part of the package.
func (s *Server) registerWebRoutes(mux *http.ServeMux) error {
	if err := s.cfg.WebSessions.checkAndSetDefaults(s.cfg.Clock.Now); err != nil {
		return trace.Wrap(err)
	}
	// The web state outlives every request (resumable terminals, sweeps); Shutdown cancels it.
	ctx, cancel := context.WithCancel(context.Background())
	s.web = &webState{ctx: ctx, cancel: cancel}
	if locks := s.cfg.WebSessions.Locks; locks != nil {
		s.web.locksDone = make(chan struct{})
		go s.web.enforceLocks(s, locks)
	}
	if watch := s.cfg.WebSessions.Watch; watch != nil {
		s.web.watchDone = make(chan struct{})
		go s.web.watchSessions(s, watch)
	}
	mux.HandleFunc("POST /webapi/sessions", s.createSession)
	mux.HandleFunc("DELETE /webapi/sessions", s.requireAnySession(s.deleteSession))
	mux.HandleFunc("POST /webapi/sessions/token", s.sessionTokenForTab)
	mux.HandleFunc("POST /webapi/mfa/login/begin", s.mfaLoginBegin)
	mux.HandleFunc("POST /webapi/mfa/login/finish", s.mfaLoginFinish)
	mux.HandleFunc("POST /webapi/mfa/register/begin", s.requireAnySession(s.mfaRegisterBegin))
	mux.HandleFunc("POST /webapi/mfa/register/finish", s.requireAnySession(s.mfaRegisterFinish))
	mux.HandleFunc("GET /webapi/mfa/devices", s.requireAnySession(s.mfaDevices))
	mux.HandleFunc("PUT /webapi/mfa/devices/{id}", s.requireSession(s.mfaRenameDevice))
	mux.HandleFunc("DELETE /webapi/mfa/devices/{id}", s.requireSession(s.mfaDeleteDevice))
	mux.HandleFunc("POST /webapi/mfa/session/begin", s.requireSession(s.sessionMFABegin))
	mux.HandleFunc("POST /webapi/mfa/session/finish", s.requireSession(s.sessionMFAFinish))
	mux.HandleFunc("POST /webapi/login/console", s.webConsoleLogin)
	mux.HandleFunc("POST /webapi/login/console/finish", s.requireSession(s.webConsoleFinish))
	mux.HandleFunc("POST /webapi/login/console/challenge", s.requireSession(s.webConsoleChallenge))
	mux.HandleFunc("GET /webapi/nodes", s.requireSession(s.listNodes))
	mux.HandleFunc("GET /webapi/clusters", s.requireSession(s.listClusters))
	mux.HandleFunc("GET /webapi/sessions/active", s.requireSession(s.listActiveSessions))
	mux.HandleFunc("GET /webapi/sessions/{id}/join", s.joinSession)
	mux.HandleFunc("GET /webapi/terminal", s.terminal)
	mux.HandleFunc("GET /webapi/terminals", s.requireSession(s.listTerminals))
	mux.HandleFunc("DELETE /webapi/terminals/{id}", s.requireSession(s.endTerminal))
	mux.HandleFunc("POST /webapi/terminals/{id}/resume", s.requireSession(s.resumeTerminal))
	mux.HandleFunc("GET /webapi/recordings", s.requireSession(s.listRecordings))
	mux.HandleFunc("GET /webapi/recordings/{id}/index", s.requireSession(s.recordingIndex))
	mux.HandleFunc("GET /webapi/recordings/{id}/segments/{n}", s.requireSession(s.recordingSegment))
	mux.HandleFunc("GET /webapi/recordings/{id}/cast", s.requireSession(s.recordingCast))
	mux.HandleFunc("GET /webapi/recordings/{id}/markers", s.requireSession(s.recordingMarkers))
	s.registerRequestRoutes(mux)
	s.registerUI(mux)
	return nil
}
