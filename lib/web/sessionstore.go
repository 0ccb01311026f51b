package web

import (
	"context"
	"encoding/hex"
	"sync"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// The store of web sessions: the records (hashes and expiries) that a
// backend, or this process, keeps. What a record cannot hold, the key
// that acts for the user, is in sessionregistry.go.

// SessionRecord is what the store keeps about a web session: the one
// record layout of the backend (services.WebSession), whoever writes it.
type SessionRecord = services.WebSession

// SessionRef names a web session by the secrets its browser presented:
// the session id (the cookie) and the bearer token. Stores key records by
// Key, the hash of the id; the auth API takes the secrets themselves and
// derives the key, so that a proxy acts only on sessions shown to it.
type SessionRef struct {
	ID    string
	Token string
}

// Key is the store key: the hex SHA-256 of the session id.
func (r SessionRef) Key() string { return hex.EncodeToString(hashSecret(r.ID)) }

// SessionStore keeps web session records, keyed by the hash of the
// session id. It is the narrow interface the web server needs: the auth
// API (AuthSessionStore) in a proxy, an in-memory one in tests of the web
// server alone.
type SessionStore interface {
	CreateSession(ctx context.Context, ref SessionRef, rec SessionRecord) error
	GetSession(ctx context.Context, ref SessionRef) (*SessionRecord, error)
	UpdateSession(ctx context.Context, ref SessionRef, rec SessionRecord) error
	DeleteSession(ctx context.Context, ref SessionRef) error
}

// MemorySessionStore keeps records in this process: sessions that only
// this proxy can serve, for a web server built without a shared store
// (tests; the service gives every proxy a shared one). Expired records are
// dropped when touched and on every create (no goroutine).
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
func (m *MemorySessionStore) CreateSession(ctx context.Context, ref SessionRef, rec SessionRecord) error {
	key := ref.Key()
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
func (m *MemorySessionStore) UpdateSession(ctx context.Context, ref SessionRef, rec SessionRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records[ref.Key()] = rec
	return nil
}

// GetSession returns a record or NotFound.
func (m *MemorySessionStore) GetSession(ctx context.Context, ref SessionRef) (*SessionRecord, error) {
	key := ref.Key()
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
func (m *MemorySessionStore) DeleteSession(ctx context.Context, ref SessionRef) error {
	key := ref.Key()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.records[key]; !ok {
		return trace.NotFound("web session not found")
	}
	delete(m.records, key)
	return nil
}
