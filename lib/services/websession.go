package services

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
)

// WebSession is what the backend keeps about a browser session, so that
// any proxy can serve any browser: hashes of its two secrets, never the
// secrets (a backend dump logs nobody in), the user it is bound to, and
// its expiries. The key that acts for the user stays in the memory of each
// proxy that serves the session; a proxy that has none asks auth for a
// certificate of its own by presenting both secrets (see
// auth.Server.WebSessionCerts).
type WebSession struct {
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
	// RegisterOnly marks the session of a user who proved their password
	// but has no second factor while auth_preference requires one: it
	// can only register a factor (the Account page), never reach a node,
	// and auth certifies no key for it.
	RegisterOnly bool `json:"register_only,omitempty"`
}

var webSessionsPrefix = []string{"web", "sessions"}

// WebSessionsPrefix is where web sessions live: /web/sessions/KEY, KEY
// being the hex SHA-256 of the session id.
func WebSessionsPrefix() string { return backend.Prefix(webSessionsPrefix...) }

// WebSessionKey is the backend key of a session.
func WebSessionKey(key string) string { return backend.Key(append(webSessionsPrefix, key)...) }

// WebSessionEndID names a session's end in the session watch: a hash of
// its key under a label of its own, so the watch gives a proxy neither
// the key nor the session id of a session it does not serve, while one
// that serves it computes the same id from the key it holds.
func WebSessionEndID(key string) string {
	h := sha256.Sum256([]byte("postern web session end\x00" + key))
	return hex.EncodeToString(h[:])
}

// CheckWebSessionKey accepts only what a session key is, the hex SHA-256
// of a session id, so that a key from the API cannot name anything else.
func CheckWebSessionKey(key string) error {
	if len(key) != 64 {
		return trace.BadParameter("web session key must be 64 hex digits")
	}
	if _, err := hex.DecodeString(key); err != nil {
		return trace.BadParameter("web session key must be 64 hex digits")
	}
	return nil
}

// CreateWebSession stores a new session; AlreadyExists if the key is
// taken.
func (s *Store) CreateWebSession(ctx context.Context, key string, ws WebSession) error {
	if err := CheckWebSessionKey(key); err != nil {
		return trace.Wrap(err)
	}
	if ws.User == "" || len(ws.TokenHash) == 0 || ws.Expires.IsZero() {
		return trace.BadParameter("web session needs a user, a token hash and an expiry")
	}
	return trace.Wrap(s.create(ctx, WebSessionKey(key), ws, ws.Expires))
}

// GetWebSession returns a session or NotFound.
func (s *Store) GetWebSession(ctx context.Context, key string) (*WebSession, error) {
	if err := CheckWebSessionKey(key); err != nil {
		return nil, trace.NotFound("web session not found")
	}
	var ws WebSession
	if err := s.get(ctx, WebSessionKey(key), &ws, "web session not found"); err != nil {
		return nil, trace.Wrap(err)
	}
	return &ws, nil
}

// TouchWebSession moves a session's LastActive forward to at, and never
// anything else: a caller that may record use cannot rebind a session to
// another user or token. NotFound when it is gone (a logout on another
// proxy wins over a touch).
func (s *Store) TouchWebSession(ctx context.Context, key string, at time.Time) error {
	if err := CheckWebSessionKey(key); err != nil {
		return trace.NotFound("web session not found")
	}
	bkey := WebSessionKey(key)
	for attempt := 0; attempt < 10; attempt++ {
		item, err := s.b.Get(ctx, bkey)
		if err != nil {
			if trace.IsNotFound(err) {
				return trace.NotFound("web session not found")
			}
			return trace.Wrap(err)
		}
		var ws WebSession
		if err := json.Unmarshal(item.Value, &ws); err != nil {
			return trace.BadParameter("corrupt record at %q: %v", bkey, err)
		}
		if !at.After(ws.LastActive) {
			return nil
		}
		ws.LastActive = at
		data, err := json.Marshal(ws)
		if err != nil {
			return trace.Wrap(err)
		}
		_, err = s.b.CompareAndSwap(ctx, *item, backend.Item{Key: bkey, Value: data, Expires: ws.Expires})
		if trace.IsCompareFailed(err) {
			continue
		}
		return trace.Wrap(err)
	}
	return trace.CompareFailed("web session %s is being touched concurrently", key[:8])
}

// DeleteWebSession removes a session; NotFound if it is not there.
func (s *Store) DeleteWebSession(ctx context.Context, key string) error {
	if err := CheckWebSessionKey(key); err != nil {
		return trace.NotFound("web session not found")
	}
	err := s.b.Delete(ctx, WebSessionKey(key))
	if trace.IsNotFound(err) {
		return trace.NotFound("web session not found")
	}
	return trace.Wrap(err)
}

// DeleteUserWebSessions removes every web session of user and returns how
// many there were; each removal is an end on the session watch, so every
// proxy closes that session's terminals. For an admin's password reset:
// the only place that walks the records, and it returns none of them.
func (s *Store) DeleteUserWebSessions(ctx context.Context, user string) (int, error) {
	items, err := s.b.GetRange(ctx, WebSessionsPrefix(), 0)
	if err != nil {
		return 0, trace.Wrap(err)
	}
	n := 0
	for _, item := range items {
		var ws WebSession
		if err := json.Unmarshal(item.Value, &ws); err != nil || ws.User != user {
			continue
		}
		if err := s.b.Delete(ctx, item.Key); err != nil && !trace.IsNotFound(err) {
			return n, trace.Wrap(err)
		}
		n++
	}
	return n, nil
}
