// Package etcdbk is the Backend on etcd v3, for clusters whose auth servers
// must survive the loss of one machine.
//
// Layout: every key lives under Config.Prefix (default "/postern"), so one
// etcd can be shared with other users. Each etcd value is an envelope (see
// encode) carrying the item's expiry next to its value, because etcd leases
// cannot be read back as an absolute time and reads must hide an item the
// moment it expires, before the lease is revoked.
//
// Expiry: items expiring in the same second share one lease, sized to the
// remaining time rounded up to whole seconds. etcd enforces a minimum lease TTL (1.5-2 s
// with default timings) and revokes expired leases on the leader's own
// schedule, so delete events arrive up to a second or two after Expires;
// reads filter on the envelope and are exact. Leases therefore follow the
// server's real time: with a fake Clock, reads hide items on the fake time
// but deletes happen on real time.
//
// Revisions are etcd's ModRevision, so they are global and monotonic.
package etcdbk

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/postern-dev/postern/lib/backend"
)

// DefaultPrefix namespaces Postern's keys in a shared etcd.
const DefaultPrefix = "/postern"

// DefaultDialTimeout bounds the first connection in New and each dial
// attempt after: long enough for a TLS handshake across a WAN, short enough
// that a wrong endpoint fails start-up quickly with a clear error.
const DefaultDialTimeout = 5 * time.Second

// DefaultRequestTimeout bounds one backend call whose caller set no
// deadline of its own. etcd without a quorum does not fail a request, it
// holds it; without a bound a login would hang instead of answering 503.
// A few seconds covers a leader election (1 s with etcd's default timings)
// and a loaded disk.
const DefaultRequestTimeout = 5 * time.Second

// Config configures the etcd backend.
type Config struct {
	// Endpoints are etcd client URLs; required.
	Endpoints []string
	// Prefix namespaces every key; default DefaultPrefix. A trailing
	// separator is removed.
	Prefix string
	// DialTimeout; zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// RequestTimeout bounds each call made without a deadline; zero
	// means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// TLS, when set, is used for the client connections (mTLS to etcd);
	// see LoadTLS.
	TLS *tls.Config
	// Clock decides when an item is expired on read and how long its lease
	// is; nil means the real clock.
	Clock clockwork.Clock
	// Logger; nil means logrus with component=backend.etcd.
	Logger logrus.FieldLogger
}

// CheckAndSetDefaults validates the config and fills in defaults.
func (c *Config) CheckAndSetDefaults() error {
	if len(c.Endpoints) == 0 {
		return trace.BadParameter("etcd backend: missing Endpoints")
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	c.Prefix = strings.TrimRight(c.Prefix, backend.Separator)
	if c.Prefix != "" && !strings.HasPrefix(c.Prefix, backend.Separator) {
		return trace.BadParameter("etcd backend: prefix %q must start with %q", c.Prefix, backend.Separator)
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = logrus.WithField("component", "backend.etcd")
	}
	return nil
}

// Backend is the etcd Backend.
type Backend struct {
	cfg    Config
	client *clientv3.Client

	// mu guards closed and watchers.
	mu       sync.Mutex
	closed   bool
	watchers map[*backend.BufferedWatcher]struct{}
	// leaseMu guards leases: expiry second (Unix) -> the lease shared by
	// every item expiring in that second.
	leaseMu sync.Mutex
	leases  map[int64]clientv3.LeaseID

	// wg counts watch goroutines; Close waits for them before closing the
	// client.
	wg sync.WaitGroup
}

var _ backend.Backend = (*Backend)(nil)

// New connects to etcd and checks it answers within DialTimeout, so a wrong
// endpoint or certificate fails start-up instead of the first request.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		// Keepalives notice a member that vanished without closing the
		// connection (power loss, partition), so the client moves to
		// another endpoint instead of waiting on a dead socket.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		TLS:                  cfg.TLS,
		Context:              context.Background(),
		// The client's own zap logs would bypass logrus; errors it returns
		// are logged by us with context instead.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, trace.ConnectionProblem(err, "etcd backend: connecting to %v: %v", cfg.Endpoints, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := client.Get(pingCtx, cfg.Prefix+"/", clientv3.WithCountOnly(), clientv3.WithLimit(1)); err != nil {
		client.Close()
		msg := err.Error()
		if why := probe(ctx, cfg); why != "" {
			msg = why
		}
		return nil, trace.ConnectionProblem(err, "etcd backend: no answer from %v within %v: %v", cfg.Endpoints, cfg.DialTimeout, msg)
	}
	return &Backend{
		cfg:      cfg,
		client:   client,
		watchers: make(map[*backend.BufferedWatcher]struct{}),
		leases:   make(map[int64]clientv3.LeaseID),
	}, nil
}

// Clock implements Backend.
func (b *Backend) Clock() clockwork.Clock { return b.cfg.Clock }

// Client exposes the etcd client (for tests and diagnostics).
func (b *Backend) Client() *clientv3.Client { return b.client }

// Close closes the watchers, waits for their goroutines and closes the
// client.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	ws := make([]*backend.BufferedWatcher, 0, len(b.watchers))
	for w := range b.watchers {
		ws = append(ws, w)
	}
	b.mu.Unlock()
	for _, w := range ws {
		w.CloseWithError(trace.ConnectionProblem(nil, "etcd backend is closed"))
	}
	b.wg.Wait()
	return trace.Wrap(b.client.Close())
}

func (b *Backend) checkOpen() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return trace.ConnectionProblem(nil, "etcd backend is closed")
	}
	return nil
}

// etcdKey maps a backend key into the namespace; userKey maps back.
func (b *Backend) etcdKey(key string) string { return b.cfg.Prefix + key }
func (b *Backend) userKey(key []byte) string { return strings.TrimPrefix(string(key), b.cfg.Prefix) }

// envelopeVersion is the first byte of every stored value; a different
// first byte means the value was not written by this code.
const envelopeVersion = 1

// encode lays a value out as: version (1 byte), expires in Unix nanoseconds
// (8 bytes big-endian, 0 = never), then the value itself. Binary rather than
// JSON so that values are stored as-is, without base64 growth.
func encode(item backend.Item) string {
	buf := make([]byte, 9+len(item.Value))
	buf[0] = envelopeVersion
	if !item.Expires.IsZero() {
		binary.BigEndian.PutUint64(buf[1:9], uint64(item.Expires.UnixNano()))
	}
	copy(buf[9:], item.Value)
	return string(buf)
}

func decode(key string, data []byte) (backend.Item, error) {
	if len(data) < 9 || data[0] != envelopeVersion {
		return backend.Item{}, trace.BadParameter("etcd backend: value of %q is not a Postern item", key)
	}
	it := backend.Item{Key: key, Value: append([]byte{}, data[9:]...)}
	if n := int64(binary.BigEndian.Uint64(data[1:9])); n != 0 {
		it.Expires = time.Unix(0, n)
	}
	return it, nil
}

// convertError classifies etcd client errors: anything that is not already
// classified is a ConnectionProblem (timeouts, no leader, unavailable), which
// is what callers need to decide whether to retry. The message names the
// endpoints: "context deadline exceeded" alone sends an operator looking in
// the wrong place.
func (b *Backend) convertError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(trace.Error); ok {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return trace.Wrap(err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return trace.ConnectionProblem(err, "etcd at %s: no answer in time (is a quorum of members up?)", strings.Join(b.cfg.Endpoints, ","))
	}
	return trace.ConnectionProblem(err, "etcd at %s: %v", strings.Join(b.cfg.Endpoints, ","), err)
}

// withTimeout bounds a call by RequestTimeout unless the caller set an
// earlier deadline.
func (b *Backend) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= b.cfg.RequestTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.cfg.RequestTimeout)
}
