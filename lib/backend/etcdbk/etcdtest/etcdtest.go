// Package etcdtest starts a real, single-member etcd server inside the test
// process, on 127.0.0.1, with its data in t.TempDir(). The etcd backend's
// tests use it, and so can integration tests that want a cluster on etcd.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startTimeout bounds the wait for the member to become ready. It is
// normally ready in well under a second; a loaded 2-core CI machine can be
// much slower.
const startTimeout = 60 * time.Second

// Server is a running embedded etcd.
type Server struct {
	// Etcd is the embedded server, for tests that need to poke at it (e.g.
	// stop it to test reconnects).
	Etcd *embed.Etcd
	// Endpoints are the client URLs ("http://127.0.0.1:PORT").
	Endpoints []string

	// cfg is kept so that Restart can bring the same member back on the
	// same data dir and ports.
	cfg *embed.Config
}

// Start starts an embedded etcd and stops it (fully: all its goroutines)
// in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "postern-test"
	cfg.Dir = t.TempDir()
	// Peer URL port 0 cannot be used: the URL is written into
	// InitialCluster before anything listens. Pick free ports first. Another
	// process could take them in between; that race is tolerable in tests.
	clientURL := freeURL(t)
	peerURL := freeURL(t)
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// etcd logs chattily at info; tests only want to hear about trouble.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())

	s := &Server{Endpoints: []string{clientURL.String()}, cfg: cfg}
	// One cleanup for the whole life of s: it stops whichever member
	// Restart left running.
	t.Cleanup(s.Stop)
	s.start(t)
	return s
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	e, err := embed.StartEtcd(s.cfg)
	if err != nil {
		t.Fatalf("starting embedded etcd: %v", err)
	}
	s.Etcd = e
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("embedded etcd failed: %v", err)
	case <-time.After(startTimeout):
		e.Server.Stop()
		t.Fatalf("embedded etcd not ready after %v", startTimeout)
	}
}

// Stop stops the member and waits for all its goroutines; its data stays
// on disk for Restart. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.Etcd == nil {
		return
	}
	s.Etcd.Close()
	<-s.Etcd.Server.StopNotify()
	s.Etcd = nil
}

// Restart brings a stopped member back on the same data dir and the same
// client and peer ports, so clients configured with Endpoints reconnect
// to it: what an operator's etcd restart looks like to Postern. On an
// existing data dir etcd ignores the initial-cluster settings and
// recovers its state from the WAL.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.start(t)
}

func freeURL(t testing.TB) url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("picking a free port: %v", err)
	}
	addr := l.Addr().String()
	l.Close()
	return url.URL{Scheme: "http", Host: addr}
}

// String is for logs.
func (s *Server) String() string { return fmt.Sprintf("etcd at %v", s.Endpoints) }
