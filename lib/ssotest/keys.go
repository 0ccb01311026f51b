package ssotest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"sync"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// rotatingKeys is the example provider's storage with signing keys that
// rotate, as a real provider's do: it signs with its current key and
// publishes (in its JWKS) the keys it was told to keep. The example
// storage has one key for its life, which would never show whether a
// relying party picks up a new key, or keeps trusting a withdrawn one.
type rotatingKeys struct {
	*storage.Storage

	// mu guards current and published.
	mu        sync.Mutex
	current   *rsaKey
	published []*rsaKey
	next      int
}

// rsaKey is one RS256 signing key and its public half.
type rsaKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k *rsaKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *rsaKey) Algorithm() jose.SignatureAlgorithm          { return jose.RS256 }
func (k *rsaKey) ID() string                                  { return k.id }
func (k *rsaKey) Use() string                                 { return "sig" }

// signing is the key as op.SigningKey (the private half).
type signing struct{ *rsaKey }

func (s signing) Key() any { return s.key }

// public is the key as op.Key (the public half, for the JWKS).
type public struct{ *rsaKey }

func (p public) Key() any { return &p.key.PublicKey }

func newRotatingKeys(st *storage.Storage) (*rotatingKeys, error) {
	r := &rotatingKeys{Storage: st}
	if err := r.rotate(false); err != nil {
		return nil, err
	}
	return r, nil
}

// rotate makes a new current key; the old one stays published only when
// keepOld is set.
func (r *rotatingKeys) rotate(keepOld bool) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	k := &rsaKey{id: fmt.Sprintf("key%d", r.next), key: key}
	if !keepOld {
		r.published = nil
	}
	r.current = k
	r.published = append(r.published, k)
	return nil
}

// SigningKey implements op.Storage: the current key.
func (r *rotatingKeys) SigningKey(context.Context) (op.SigningKey, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return signing{r.current}, nil
}

// SignatureAlgorithms implements op.Storage.
func (r *rotatingKeys) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

// KeySet implements op.Storage: the published keys.
func (r *rotatingKeys) KeySet(context.Context) ([]op.Key, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]op.Key, 0, len(r.published))
	for _, k := range r.published {
		keys = append(keys, public{k})
	}
	return keys, nil
}

// RotateKey makes the provider sign with a new key from now on. With
// keepOld its JWKS still lists the previous keys (a rotation with
// overlap); without, only the new one (the old key withdrawn).
func (p *Provider) RotateKey(keepOld bool) error {
	return p.keys.rotate(keepOld)
}
