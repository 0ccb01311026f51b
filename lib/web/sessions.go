package web

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// A web session is two secrets: the session id travels in the
// `__Host-session` cookie (HttpOnly, so page scripts cannot read it) and
// the bearer token travels in the Authorization header (which a
// cross-site page cannot set). A request needs both, which is the CSRF
// defence of every API call: a forged form or image carries the cookie but
// never the header, and a script that stole the token from the page has no
// cookie on another origin.
//
// The backend keeps only hashes of both (a leaked backend dump does not
// log anybody in) and the expiries. The private key and the user
// certificate live in this proxy's memory only: they never reach the
// backend or the browser, and a proxy restart ends its web sessions (the
// user logs in again).

// SessionCookieName is the cookie of a web session. The __Host- prefix
// makes the browser refuse it unless it is Secure, Path=/ and without a
// Domain, so a sibling subdomain cannot plant or read it.
const SessionCookieName = "__Host-session"

// Defaults of the web session lifetimes.
const (
	// DefaultSessionIdleTTL ends a session nobody used for half an hour:
	// an unattended browser tab should not stay a way into every node.
	DefaultSessionIdleTTL = 30 * time.Minute
	// DefaultSessionTTL is the absolute bound, a working day; the user
	// certificate behind the session is also capped by the roles'
	// max_session_ttl, and the session never outlives it.
	DefaultSessionTTL = 8 * time.Hour
	// touchInterval bounds backend writes: the idle expiry is pushed
	// forward at most once a minute per session, not on every request.
	touchInterval = time.Minute
)

// SessionRecord is what the store keeps about a web session.
type SessionRecord struct {
	// User is the Postern user.
	User string `json:"user"`
	// TokenHash is SHA-256 of the bearer token.
	TokenHash []byte `json:"token_hash"`
	// Created is the login time.
	Created time.Time `json:"created"`
	// Expires is the absolute expiry.
	Expires time.Time `json:"expires"`
	// LastActive is the last recorded use; the session is idle-expired
	// when LastActive + idle TTL has passed.
	LastActive time.Time `json:"last_active"`
}

// SessionStore keeps web session records, keyed by the hash of the
// session id. It is the narrow interface the web server needs: a
// backend-backed store when auth (and so the backend) is in this process,
// an in-memory one otherwise.
type SessionStore interface {
	CreateSession(ctx context.Context, key string, rec SessionRecord) error
	GetSession(ctx context.Context, key string) (*SessionRecord, error)
	UpdateSession(ctx context.Context, key string, rec SessionRecord) error
	DeleteSession(ctx context.Context, key string) error
}

// sessionsPrefix is where BackendSessionStore keeps records.
var sessionsPrefix = []string{"web", "sessions"}

// BackendSessionStore keeps records under /web/sessions/KEY with the
// backend item expiring at the absolute expiry, so the backend sweeps
// abandoned sessions.
type BackendSessionStore struct {
	Backend backend.Backend
}

var _ SessionStore = (*BackendSessionStore)(nil)

func (b *BackendSessionStore) put(ctx context.Context, key string, rec SessionRecord, create bool) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return trace.Wrap(err)
	}
	item := backend.Item{Key: backend.Key(append(sessionsPrefix, key)...), Value: data, Expires: rec.Expires}
	if create {
		_, err = b.Backend.Create(ctx, item)
	} else {
		_, err = b.Backend.Put(ctx, item)
	}
	return trace.Wrap(err)
}

// CreateSession stores a new record.
func (b *BackendSessionStore) CreateSession(ctx context.Context, key string, rec SessionRecord) error {
	return b.put(ctx, key, rec, true)
}

// UpdateSession replaces a record.
func (b *BackendSessionStore) UpdateSession(ctx context.Context, key string, rec SessionRecord) error {
	return b.put(ctx, key, rec, false)
}

// GetSession returns a record or NotFound.
func (b *BackendSessionStore) GetSession(ctx context.Context, key string) (*SessionRecord, error) {
	item, err := b.Backend.Get(ctx, backend.Key(append(sessionsPrefix, key)...))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var rec SessionRecord
	if err := json.Unmarshal(item.Value, &rec); err != nil {
		return nil, trace.Wrap(err)
	}
	return &rec, nil
}

// DeleteSession removes a record.
func (b *BackendSessionStore) DeleteSession(ctx context.Context, key string) error {
	return trace.Wrap(b.Backend.Delete(ctx, backend.Key(append(sessionsPrefix, key)...)))
}

// MemorySessionStore keeps records in this process. It is what a proxy
// whose auth server runs elsewhere uses: the auth API offers no
// web-session calls, and since the session's key material lives in this
// proxy's memory anyway, a session cannot be used on another proxy. Expired
// records are dropped when touched and on every create (no goroutine).
type MemorySessionStore struct {
	// mu guards records.
	mu      sync.Mutex
	records map[string]SessionRecord
	now     func() time.Time
}

var _ SessionStore = (*MemorySessionStore)(nil)

// NewMemorySessionStore returns an empty store; now is the clock.
func NewMemorySessionStore(now func() time.Time) *MemorySessionStore {
	return &MemorySessionStore{records: map[string]SessionRecord{}, now: now}
}

// CreateSession stores a new record.
func (m *MemorySessionStore) CreateSession(ctx context.Context, key string, rec SessionRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for k, r := range m.records {
		if !now.Before(r.Expires) {
			delete(m.records, k)
		}
	}
	if _, ok := m.records[key]; ok {
		return trace.AlreadyExists("web session already exists")
	}
	m.records[key] = rec
	return nil
}

// UpdateSession replaces a record.
func (m *MemorySessionStore) UpdateSession(ctx context.Context, key string, rec SessionRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records[key] = rec
	return nil
}

// GetSession returns a record or NotFound.
func (m *MemorySessionStore) GetSession(ctx context.Context, key string) (*SessionRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.records[key]
	if !ok || !m.now().Before(rec.Expires) {
		delete(m.records, key)
		return nil, trace.NotFound("web session not found")
	}
	return &rec, nil
}

// DeleteSession removes a record.
func (m *MemorySessionStore) DeleteSession(ctx context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.records[key]; !ok {
		return trace.NotFound("web session not found")
	}
	delete(m.records, key)
	return nil
}

// liveSession is a session's in-memory half: the key that authenticates
// to nodes on the user's behalf.
type liveSession struct {
	key     string // hash of the session id: the store key
	user    string
	signer  ssh.Signer
	cert    *ssh.Certificate
	hostCAs []ssh.PublicKey
	expires time.Time
	// ctx ends when the session is logged out or expires; terminals
	// opened with the session run under it.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// sessionRegistry holds the live halves of this proxy's web sessions.
type sessionRegistry struct {
	// mu guards byKey.
	mu    sync.Mutex
	byKey map[string]*liveSession
}

func (r *sessionRegistry) add(s *liveSession) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey = map[string]*liveSession{}
	}
	r.byKey[s.key] = s
}

func (r *sessionRegistry) get(key string) *liveSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byKey[key]
}

// remove drops a session and ends its terminals.
func (r *sessionRegistry) remove(key string) {
	r.mu.Lock()
	s := r.byKey[key]
	delete(r.byKey, key)
	r.mu.Unlock()
	if s != nil {
		s.cancel(errLoggedOut)
	}
}

// closeAll ends every session's terminals (server shutdown).
func (r *sessionRegistry) closeAll() {
	r.mu.Lock()
	all := r.byKey
	r.byKey = nil
	r.mu.Unlock()
	for _, s := range all {
		s.cancel(errShuttingDown)
	}
}

func randomHex() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", trace.Wrap(err)
	}
	return hex.EncodeToString(b[:]), nil
}

func hashSecret(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// checkLoginOrigin refuses a cross-site login POST (login CSRF: a page
// that logs the victim's browser into the attacker's account). Browsers
// send Sec-Fetch-Site on every request they make; a non-browser client
// (psh, curl) sends neither header and is not a CSRF vector.
func checkLoginOrigin(r *http.Request) error {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return trace.AccessDenied("cross-site login refused")
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return trace.AccessDenied("cross-origin login refused")
		}
	}
	return nil
}

// createSession serves POST /webapi/sessions.
func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Auth == nil || !s.cfg.WebSessions.enabled() {
		writeError(w, http.StatusNotImplemented, "web sessions are not available on this proxy")
		return
	}
	if err := checkLoginOrigin(r); err != nil {
		writeError(w, http.StatusForbidden, trace.UserMessage(err))
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxLoginBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	var req webapi.CreateSessionRequest
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.User == "" {
		writeError(w, http.StatusBadRequest, "invalid login request: expected {\"user\",\"password\",\"otp_token\"}")
		return
	}
	remote := remoteHost(r.RemoteAddr)
	log := s.cfg.Logger.WithFields(logrus.Fields{"user": req.User, "remote_addr": remote})

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal error; see the proxy's log")
		return
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal error; see the proxy's log")
		return
	}
	cfg := s.cfg.WebSessions
	// One auth call checks the password and OTP (under auth's per-user and
	// per-address failure limits, shared with psh's login) and certifies
	// the session's key: the key never leaves this process.
	resp, ok := s.authenticateSSHUser(w, r, log, authapi.SSHLoginRequest{
		AuthRequest: authapi.AuthRequest{User: req.User, Password: req.Password, OTP: req.OTPToken, RemoteAddr: remote},
		PublicKey:   ssh.MarshalAuthorizedKey(sshPub),
		TTL:         cfg.TTL,
	})
	if !ok {
		return
	}
	live, err := newLiveSession(priv, resp)
	if err != nil {
		log.WithError(err).Warn("Web login: unusable certificate from auth.")
		writeError(w, http.StatusInternalServerError, "internal error; see the proxy's log")
		return
	}
	sid, err := randomHex()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal error; see the proxy's log")
		return
	}
	token, err := randomHex()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal error; see the proxy's log")
		return
	}
	now := s.cfg.Clock.Now()
	expires := now.Add(cfg.TTL)
	if certEnd := time.Unix(int64(live.cert.ValidBefore), 0); certEnd.Before(expires) {
		expires = certEnd
	}
	live.key = hex.EncodeToString(hashSecret(sid))
	live.expires = expires
	rec := SessionRecord{User: resp.Username, TokenHash: hashSecret(token), Created: now, Expires: expires, LastActive: now}
	if err := cfg.Store.CreateSession(r.Context(), live.key, rec); err != nil {
		log.WithError(err).Warn("Could not store a web session.")
		writeError(w, http.StatusInternalServerError, "internal error; see the proxy's log")
		return
	}
	live.ctx, live.cancel = context.WithCancelCause(s.web.ctx)
	s.web.sessions.add(live)
	http.SetCookie(w, &http.Cookie{
		Name:     SessionCookieName,
		Value:    sid,
		Path:     "/",
		Expires:  expires,
		HttpOnly: true,
		Secure:   true,
		SameSite: http.SameSiteStrictMode,
	})
	log.Info("Web session created.")
	writeJSON(w, http.StatusOK, webapi.CreateSessionResponse{Token: token, Expires: expires.UTC(), User: resp.Username})
}

func newLiveSession(priv ed25519.PrivateKey, resp *authapi.SSHLoginResponse) (*liveSession, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey(resp.Cert)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, trace.BadParameter("auth returned a plain key, not a certificate")
	}
	keySigner, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	signer, err := ssh.NewCertSigner(cert, keySigner)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	live := &liveSession{user: resp.Username, signer: signer, cert: cert}
	for _, hs := range resp.HostSigners {
		for _, k := range hs.CheckingKeys {
			ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
			if err != nil {
				return nil, trace.Wrap(err)
			}
			live.hostCAs = append(live.hostCAs, ca)
		}
	}
	return live, nil
}

// Causes that end a session's terminals, shown to the browser.
var (
	errLoggedOut    = errors.New("the web session ended (logged out or expired)")
	errShuttingDown = errors.New("the proxy is shutting down")
)

// errNoSession is every authentication failure of a session call: the
// caller learns nothing about which part was wrong.
var errNoSession = trace.AccessDenied("missing or invalid web session; log in again")

// bearerToken reads "Authorization: Bearer TOKEN".
func bearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) > len(prefix) && strings.EqualFold(h[:len(prefix)], prefix) {
		return strings.TrimSpace(h[len(prefix):])
	}
	return ""
}

// authenticate checks the cookie and the token against the store and
// returns the live session, recording activity.
func (s *Server) authenticate(ctx context.Context, r *http.Request, token string) (*liveSession, error) {
	cookie, err := r.Cookie(SessionCookieName)
	if err != nil || cookie.Value == "" || token == "" {
		return nil, errNoSession
	}
	key := hex.EncodeToString(hashSecret(cookie.Value))
	cfg := s.cfg.WebSessions
	rec, err := cfg.Store.GetSession(ctx, key)
	if err != nil {
		if !trace.IsNotFound(err) {
			s.cfg.Logger.WithError(err).Warn("Could not read a web session.")
		}
		return nil, errNoSession
	}
	if subtle.ConstantTimeCompare(rec.TokenHash, hashSecret(token)) != 1 {
		return nil, errNoSession
	}
	now := s.cfg.Clock.Now()
	if !now.Before(rec.Expires) || !now.Before(rec.LastActive.Add(cfg.IdleTTL)) {
		s.endSession(ctx, key)
		return nil, errNoSession
	}
	live := s.web.sessions.get(key)
	if live == nil {
		// Created by another proxy (or before a restart): its key is not
		// here, so it cannot be used here.
		return nil, errNoSession
	}
	if err := s.checkLocks(live.user); err != nil {
		if services.IsLocked(err) {
			s.endSessionCause(ctx, key, err)
		}
		return nil, trace.AccessDenied("%s", lockRefusal(err))
	}
	if now.Sub(rec.LastActive) >= touchInterval {
		rec.LastActive = now
		if err := cfg.Store.UpdateSession(ctx, key, *rec); err != nil {
			s.cfg.Logger.WithError(err).Warn("Could not record web session activity.")
		}
	}
	return live, nil
}

// touchSession records use of a session by a running terminal, so a user
// working in a terminal for hours is not idle-expired under it.
func (s *Server) touchSession(ctx context.Context, key string) {
	store := s.cfg.WebSessions.Store
	rec, err := store.GetSession(ctx, key)
	if err != nil {
		return
	}
	rec.LastActive = s.cfg.Clock.Now()
	if err := store.UpdateSession(ctx, key, *rec); err != nil {
		s.cfg.Logger.WithError(err).Warn("Could not record web session activity.")
	}
}

// endSession deletes the record and ends the terminals that use it.
func (s *Server) endSession(ctx context.Context, key string) {
	if err := s.cfg.WebSessions.Store.DeleteSession(ctx, key); err != nil && !trace.IsNotFound(err) {
		s.cfg.Logger.WithError(err).Warn("Could not delete a web session.")
	}
	s.web.sessions.remove(key)
}

// requireSession wraps an API handler with the cookie + bearer check.
func (s *Server) requireSession(next func(http.ResponseWriter, *http.Request, *liveSession)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.cfg.WebSessions.enabled() {
			writeError(w, http.StatusNotImplemented, "web sessions are not available on this proxy")
			return
		}
		live, err := s.authenticate(r.Context(), r, bearerToken(r))
		if err != nil {
			writeError(w, http.StatusUnauthorized, trace.UserMessage(err))
			return
		}
		next(w, r, live)
	}
}

// deleteSession serves DELETE /webapi/sessions: the record goes, every
// terminal opened with the session on this proxy ends, and the cookie is
// cleared.
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, live *liveSession) {
	s.endSession(r.Context(), live.key)
	http.SetCookie(w, &http.Cookie{Name: SessionCookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	s.cfg.Logger.WithField("user", live.user).Info("Web session deleted.")
	w.WriteHeader(http.StatusNoContent)
}
