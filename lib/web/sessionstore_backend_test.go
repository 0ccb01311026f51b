package web

import (
	"context"
	"encoding/json"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/services"
)

// BackendSessionStore keeps records under /web/sessions/KEY, where the
// auth server keeps them, with the backend item expiring at the absolute
// expiry: tests of the web server share one backend between proxies with
// it, without an auth API in between.
type BackendSessionStore struct {
	Backend backend.Backend
}

var _ SessionStore = (*BackendSessionStore)(nil)

func (b *BackendSessionStore) put(ctx context.Context, key string, rec SessionRecord, create bool) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return trace.Wrap(err)
	}
	item := backend.Item{Key: services.WebSessionKey(key), Value: data, Expires: rec.Expires}
	if create {
		_, err = b.Backend.Create(ctx, item)
	} else {
		_, err = b.Backend.Put(ctx, item)
	}
	return trace.Wrap(err)
}

// CreateSession stores a new record.
func (b *BackendSessionStore) CreateSession(ctx context.Context, ref SessionRef, rec SessionRecord) error {
	return b.put(ctx, ref.Key(), rec, true)
}

// UpdateSession replaces a record.
func (b *BackendSessionStore) UpdateSession(ctx context.Context, ref SessionRef, rec SessionRecord) error {
	return b.put(ctx, ref.Key(), rec, false)
}

// GetSession returns a record or NotFound.
func (b *BackendSessionStore) GetSession(ctx context.Context, ref SessionRef) (*SessionRecord, error) {
	item, err := b.Backend.Get(ctx, services.WebSessionKey(ref.Key()))
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
func (b *BackendSessionStore) DeleteSession(ctx context.Context, ref SessionRef) error {
	return trace.Wrap(b.Backend.Delete(ctx, services.WebSessionKey(ref.Key())))
}
