package services

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/backend"
)

// The SSH servers (proxy and node) check every connection against the
// user CA and the roles in the certificate, and re-check the roles at
// every session. Read from the backend, that is several SQLite or etcd
// reads per connection (issue 17 measured 40-50% of a proxy's setup CPU
// there). AccessCache serves both from memory, kept current by watches
// (the generic ResourceWatcher, as for nodes and locks): a role edited or
// deleted, or a CA rotated, reaches every server as soon as its event
// lands (milliseconds; the watch is pushed, never polled), so it applies
// to the next connection and to the next session of an open one exactly
// as a backend read would.

// AccessEvents is what an AccessCache consumes: a watch and the full
// reads of roles, CAs and trusted clusters. *Store provides it.
type AccessEvents interface {
	NewWatcher(ctx context.Context, watch backend.Watch) (backend.Watcher, error)
	GetRoles(ctx context.Context) ([]*Role, error)
	GetCertAuthorities(ctx context.Context, t CertAuthType, withSecrets bool) ([]CertAuthority, error)
	GetTrustedClusters(ctx context.Context) ([]TrustedCluster, error)
}

var _ AccessEvents = (*Store)(nil)

// AccessCacheConfig configures an AccessCache.
type AccessCacheConfig struct {
	// Events is read and watched. Required.
	Events AccessEvents
	// Clock drives re-sync backoff; nil means the real clock.
	Clock clockwork.Clock
	// Logger; nil means logrus with component "watcher:access".
	Logger logrus.FieldLogger
	// StaleGrace, when positive, lets the cache answer from its last
	// view for this long after a watch that was live broke, while it
	// re-syncs, so that a backend outage (an etcd quorum loss, auth
	// restarting, the proxy carrying a tunnel node's watch restarting)
	// fails no login with a valid certificate; past it, it refuses until
	// the watch is back (see the comment atop stale.go). A change to
	// roles or CAs that this host cannot see meanwhile applies that much
	// later here. Zero (the default) refuses as soon as the watch breaks;
	// a cache never loaded refuses whatever the grace.
	StaleGrace time.Duration
}

// AccessCache serves roles and the public halves of the CAs from memory.
// Its answers are those of the backend as of the last event; while the
// watch is broken (re-syncing) it answers from that view for StaleGrace
// at most, counting each such answer (StaleStats), then refuses with a
// ConnectionProblem, as a failed backend read would: deny by default.
type AccessCache struct {
	// stale decides and counts answers from a broken watch (StaleGrace).
	stale *staleness
	roles *ResourceWatcher[*Role]
	cas   *ResourceWatcher[CertAuthority]
	// trusted are the roots this (leaf) cluster trusts: whether a
	// certificate of another cluster is accepted at all, and how its
	// roles map (lib/srv).
	trusted *ResourceWatcher[TrustedCluster]
	rc      *mapCollector[*Role]
	cc      *mapCollector[CertAuthority]
	tc      *mapCollector[TrustedCluster]
	// trust announces changes of the CAs and trusted clusters
	// (TrustChanges).
	trust changeNotifier
}

// NewAccessCache starts the watchers; stop them with Close.
func NewAccessCache(cfg AccessCacheConfig) (*AccessCache, error) {
	if cfg.Events == nil {
		return nil, trace.BadParameter("access cache: missing Events")
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.WithField("component", "watcher:access")
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	a := &AccessCache{
		stale: &staleness{view: "roles and certificate authorities", max: max(cfg.StaleGrace, 0), clock: cfg.Clock, log: cfg.Logger},
		rc:    newMapCollector(func(r *Role) string { return backend.Key(rolesPrefix, r.Metadata.Name) }),
		cc:    newMapCollector(func(ca CertAuthority) string { return caKey(ca.Type, ca.ClusterName) }),
		tc:    newMapCollector(func(tc TrustedCluster) string { return backend.Key(trustedClustersPrefix, tc.Metadata.Name) }),
	}
	a.cc.onChange = a.trust.notify
	a.tc.onChange = a.trust.notify
	var err error
	a.roles, err = NewResourceWatcher(ResourceWatcherConfig[*Role]{
		Name:     "roles",
		Source:   cfg.Events,
		Prefixes: []string{backend.Prefix(rolesPrefix)},
		Load:     cfg.Events.GetRoles,
		Unmarshal: func(item backend.Item) (*Role, error) {
			var r Role
			if err := json.Unmarshal(item.Value, &r); err != nil {
				return nil, trace.BadParameter("role at %q: %v", item.Key, err)
			}
			if backend.Key(rolesPrefix, r.Metadata.Name) != item.Key {
				return nil, trace.BadParameter("role at %q is named %q", item.Key, r.Metadata.Name)
			}
			return &r, nil
		},
		Collector: a.rc,
		Clock:     cfg.Clock,
		Logger:    cfg.Logger.WithField("kind", "role"),
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	a.cas, err = NewResourceWatcher(ResourceWatcherConfig[CertAuthority]{
		Name:     "authorities",
		Source:   cfg.Events,
		Prefixes: []string{backend.Prefix(authoritiesPrefix)},
		Load: func(ctx context.Context) ([]CertAuthority, error) {
			var all []CertAuthority
			for _, t := range []CertAuthType{UserCA, HostCA} {
				cas, err := cfg.Events.GetCertAuthorities(ctx, t, false)
				if err != nil {
					return nil, trace.Wrap(err)
				}
				all = append(all, cas...)
			}
			return all, nil
		},
		Unmarshal: func(item backend.Item) (CertAuthority, error) {
			var ca CertAuthority
			if err := json.Unmarshal(item.Value, &ca); err != nil {
				return ca, trace.BadParameter("certificate authority at %q: %v", item.Key, err)
			}
			// The private keys never stay in this process's memory
			// longer than the decode.
			ca.StripSecrets()
			if caKey(ca.Type, ca.ClusterName) != item.Key {
				return ca, trace.BadParameter("certificate authority at %q names %s/%s", item.Key, ca.Type, ca.ClusterName)
			}
			return ca, nil
		},
		Collector: a.cc,
		Clock:     cfg.Clock,
		Logger:    cfg.Logger.WithField("kind", "cert_authority"),
	})
	if err != nil {
		a.roles.Close()
		return nil, trace.Wrap(err)
	}
	a.trusted, err = NewResourceWatcher(ResourceWatcherConfig[TrustedCluster]{
		Name:     "trusted_clusters",
		Source:   cfg.Events,
		Prefixes: []string{TrustedClustersPrefix()},
		Load: func(ctx context.Context) ([]TrustedCluster, error) {
			tcs, err := cfg.Events.GetTrustedClusters(ctx)
			for i := range tcs {
				tcs[i].Spec.Token = ""
			}
			return tcs, trace.Wrap(err)
		},
		Unmarshal: func(item backend.Item) (TrustedCluster, error) {
			var tc TrustedCluster
			if err := json.Unmarshal(item.Value, &tc); err != nil {
				return tc, trace.BadParameter("trusted_cluster at %q: %v", item.Key, err)
			}
			tc.Spec.Token = ""
			if backend.Key(trustedClustersPrefix, tc.Metadata.Name) != item.Key {
				return tc, trace.BadParameter("trusted_cluster at %q is named %q", item.Key, tc.Metadata.Name)
			}
			return tc, nil
		},
		Collector: a.tc,
		Clock:     cfg.Clock,
		Logger:    cfg.Logger.WithField("kind", KindTrustedCluster),
	})
	if err != nil {
		a.roles.Close()
		a.cas.Close()
		return nil, trace.Wrap(err)
	}
	return a, nil
}

// ready waits for w's first load (bounded by ctx) and refuses while its
// watch is broken, past the grace after it broke (see StaleGrace).
func ready[T any](ctx context.Context, w *ResourceWatcher[T], stale *staleness) error {
	if err := w.WaitSynced(ctx); err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(stale.check(w.state()))
}

// GetRole returns a role from memory. The result is shared: callers must
// not modify it (the AccessChecker only reads).
func (a *AccessCache) GetRole(ctx context.Context, name string) (*Role, error) {
	if err := ready(ctx, a.roles, a.stale); err != nil {
		return nil, trace.Wrap(err)
	}
	r, ok := a.rc.get(backend.Key(rolesPrefix, name))
	if !ok || CheckRoleName(name) != nil {
		return nil, trace.NotFound("role %q not found", name)
	}
	return r, nil
}

// GetCertAuthority returns a CA's public keys from memory; the cache
// holds no private keys, so withSecrets is refused.
func (a *AccessCache) GetCertAuthority(ctx context.Context, clusterName string, t CertAuthType, withSecrets bool) (*CertAuthority, error) {
	if withSecrets {
		return nil, trace.BadParameter("the access cache holds no private keys")
	}
	if err := ready(ctx, a.cas, a.stale); err != nil {
		return nil, trace.Wrap(err)
	}
	ca, ok := a.cc.get(caKey(t, clusterName))
	if !ok || CheckClusterName(clusterName) != nil {
		return nil, trace.NotFound("%s certificate authority of cluster %q not found", t, clusterName)
	}
	// A copy of the struct; its key slices are replaced, never modified.
	return &ca, nil
}

// GetTrustedCluster returns a root this cluster trusts, from memory,
// without its token.
func (a *AccessCache) GetTrustedCluster(ctx context.Context, name string) (*TrustedCluster, error) {
	if err := ready(ctx, a.trusted, a.stale); err != nil {
		return nil, trace.Wrap(err)
	}
	tc, ok := a.tc.get(backend.Key(trustedClustersPrefix, name))
	if !ok || CheckClusterName(name) != nil {
		return nil, trace.NotFound("trusted_cluster %q not found", name)
	}
	return &tc, nil
}

// TrustChanges returns a channel closed at the next change of the CAs or
// the trusted clusters. The SSH servers wait on it to end the open
// connections of a root's users once this (leaf) cluster stops trusting
// the root or the CA that signed them: the checks at connect and at each
// session do not reach a shell that is already running. Take it before
// checking, so a change between the check and the wait is not missed.
func (a *AccessCache) TrustChanges() <-chan struct{} { return a.trust.changes() }

// WaitSynced blocks until every watcher has loaded, ctx's end or Close.
func (a *AccessCache) WaitSynced(ctx context.Context) error {
	if err := a.roles.WaitSynced(ctx); err != nil {
		return trace.Wrap(err)
	}
	if err := a.cas.WaitSynced(ctx); err != nil {
		return trace.Wrap(err)
	}
	return trace.Wrap(a.trusted.WaitSynced(ctx))
}

// Healthy is nil while every watch is live.
func (a *AccessCache) Healthy() error {
	if err := a.roles.Healthy(); err != nil {
		return err
	}
	if err := a.cas.Healthy(); err != nil {
		return err
	}
	return a.trusted.Healthy()
}

// StaleStats reports the answers given from a broken watch and how long
// the oldest of the three views has not been current.
func (a *AccessCache) StaleStats() StaleStats {
	r, _ := a.roles.state()
	c, _ := a.cas.state()
	t, _ := a.trusted.state()
	var oldest time.Time
	for _, at := range []time.Time{r, c, t} {
		if !at.IsZero() && (oldest.IsZero() || at.Before(oldest)) {
			oldest = at
		}
	}
	return a.stale.stats(oldest)
}

// Close stops the watchers.
func (a *AccessCache) Close() error {
	a.roles.Close()
	a.cas.Close()
	a.trusted.Close()
	return nil
}

// mapCollector holds resources by backend key; mu guards items.
type mapCollector[T any] struct {
	key   func(T) string
	mu    sync.RWMutex
	items map[string]T
	// onChange, when set, runs after every change (outside mu).
	onChange func()
}

func (c *mapCollector[T]) changed() {
	if c.onChange != nil {
		c.onChange()
	}
}

// changeNotifier hands out a channel that is closed at the next notify;
// the zero value is ready to use.
type changeNotifier struct {
	// mu guards ch.
	mu sync.Mutex
	ch chan struct{}
}

func (n *changeNotifier) changes() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *changeNotifier) notify() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}

func newMapCollector[T any](key func(T) string) *mapCollector[T] {
	return &mapCollector[T]{key: key, items: map[string]T{}}
}

func (c *mapCollector[T]) Reset(items []T) {
	m := make(map[string]T, len(items))
	for _, it := range items {
		m[c.key(it)] = it
	}
	c.mu.Lock()
	c.items = m
	c.mu.Unlock()
	c.changed()
}

func (c *mapCollector[T]) Put(it T) {
	c.mu.Lock()
	c.items[c.key(it)] = it
	c.mu.Unlock()
	c.changed()
}

func (c *mapCollector[T]) Delete(key string) {
	c.mu.Lock()
	delete(c.items, key)
	c.mu.Unlock()
	c.changed()
}

func (c *mapCollector[T]) get(key string) (T, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	it, ok := c.items[key]
	return it, ok
}

// RolesPrefix is the prefix of every role key.
func RolesPrefix() string { return backend.Prefix(rolesPrefix) }

// AuthoritiesPrefix is the prefix of every certificate authority key.
func AuthoritiesPrefix() string { return backend.Prefix(authoritiesPrefix) }

// IsAuthorityKey reports whether key is a certificate authority's.
func IsAuthorityKey(key string) bool { return strings.HasPrefix(key, AuthoritiesPrefix()) }

// NetworkingKey is the backend key of the cluster networking config.
func NetworkingKey() string { return networkingKey() }
