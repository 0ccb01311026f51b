// Package etcdtest starts real etcd servers inside the test process, on
// 127.0.0.1, with their data in t.TempDir(): one member (Start), one
// member that only speaks mutual TLS (StartTLS), or a cluster of several
// members (StartCluster) whose members tests stop and restart to see what
// Postern does when etcd loses one member, then its quorum. The etcd
// backend's tests use it, and so do integration tests.
package etcdtest

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/lib/freeport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startTimeout bounds the wait for a member to become ready. It is
// normally ready in well under a second; a loaded 2-core CI machine can be
// much slower.
const startTimeout = 60 * time.Second

// Server is one embedded etcd member.
type Server struct {
	// Etcd is the embedded server, for tests that need to poke at it; nil
	// while the member is stopped.
	Etcd *embed.Etcd
	// Endpoints are the client URLs ("http://127.0.0.1:PORT", https with
	// StartTLS).
	Endpoints []string
	// TLS holds the files a client needs, for a StartTLS member; nil
	// otherwise.
	TLS *TLSFiles

	// mu guards Etcd against a test's Stop racing its cleanup.
	mu sync.Mutex
	// cfg is kept so that Restart can bring the same member back on the
	// same data dir and ports.
	cfg *embed.Config
}

// Start starts a single-member etcd and stops it (fully: all its
// goroutines) in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	s := newMember(t, "postern-test", "http")
	s.cfg.InitialCluster = s.cfg.InitialClusterFromName(s.cfg.Name)
	t.Cleanup(s.Stop)
	s.start(t)
	s.waitReady(t)
	return s
}

// StartTLS starts a single-member etcd that accepts only clients with a
// certificate from its own test CA, on https client URLs. TLS names the
// CA, and a client certificate and key, as files.
func StartTLS(t testing.TB) *Server {
	t.Helper()
	files := WriteTLSFiles(t)
	s := newMember(t, "postern-tls", "https")
	s.TLS = files
	s.cfg.ClientTLSInfo.CertFile = files.serverCert
	s.cfg.ClientTLSInfo.KeyFile = files.serverKey
	s.cfg.ClientTLSInfo.TrustedCAFile = files.CAFile
	s.cfg.ClientTLSInfo.ClientCertAuth = true
	s.cfg.InitialCluster = s.cfg.InitialClusterFromName(s.cfg.Name)
	t.Cleanup(s.Stop)
	s.start(t)
	s.waitReady(t)
	return s
}

// Cluster is several members forming one etcd cluster.
type Cluster struct {
	Members []*Server
	// Endpoints are the client URLs of every member: what a client is
	// configured with, so that it fails over between members.
	Endpoints []string
}

// StartCluster starts an n-member cluster and waits until it has a
// leader. Every member is stopped in t.Cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	var initial []string
	for i := 0; i < n; i++ {
		m := newMember(t, fmt.Sprintf("m%d", i), "http")
		c.Members = append(c.Members, m)
		c.Endpoints = append(c.Endpoints, m.Endpoints...)
		initial = append(initial, fmt.Sprintf("%s=%s", m.cfg.Name, m.cfg.AdvertisePeerUrls[0].String()))
		t.Cleanup(m.Stop)
	}
	for _, m := range c.Members {
		m.cfg.InitialCluster = strings.Join(initial, ",")
		m.cfg.InitialClusterToken = "postern-test-cluster"
	}
	// Members are started together: each becomes ready only once a
	// quorum of them talks, so starting them one by one would deadlock.
	for _, m := range c.Members {
		m.start(t)
	}
	for _, m := range c.Members {
		m.waitReady(t)
	}
	return c
}

func newMember(t testing.TB, name, scheme string) *Server {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = t.TempDir()
	// Peer URL port 0 cannot be used: the URL is written into
	// InitialCluster before anything listens, and Restart must come back
	// on the same ports. freeport picks them outside the ephemeral range,
	// where parallel tests' listeners and connections cannot take them.
	clientURL := freeURL(t, scheme)
	peerURL := freeURL(t, "http")
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	// etcd logs chattily at info; tests only want to hear about trouble.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	return &Server{Endpoints: []string{clientURL.String()}, cfg: cfg}
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	e, err := embed.StartEtcd(s.cfg)
	if err != nil {
		t.Fatalf("starting embedded etcd %s: %v", s.cfg.Name, err)
	}
	s.mu.Lock()
	s.Etcd = e
	s.mu.Unlock()
}

func (s *Server) waitReady(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	e := s.Etcd
	s.mu.Unlock()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("embedded etcd %s failed: %v", s.cfg.Name, err)
	case <-time.After(startTimeout):
		t.Fatalf("embedded etcd %s not ready after %v", s.cfg.Name, startTimeout)
	}
}

// Stop stops the member and waits for all its goroutines; its data stays
// on disk for Restart. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.Etcd
	s.Etcd = nil
	s.mu.Unlock()
	if e == nil {
		return
	}
	e.Close()
	<-e.Server.StopNotify()
}

// Restart brings a stopped member back on the same data dir and the same
// client and peer ports, so clients configured with Endpoints reconnect
// to it: what an operator's etcd restart looks like to Postern. On an
// existing data dir etcd ignores the initial-cluster settings and
// recovers its state from the WAL. In a cluster, it returns once the
// member is ready, which needs a quorum of members running.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.start(t)
	s.waitReady(t)
}

func freeURL(t testing.TB, scheme string) url.URL {
	t.Helper()
	return url.URL{Scheme: scheme, Host: freeport.Addr(t)}
}

// String is for logs.
func (s *Server) String() string { return fmt.Sprintf("etcd at %v", s.Endpoints) }
