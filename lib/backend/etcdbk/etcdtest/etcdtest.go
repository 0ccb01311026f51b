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

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("starting embedded etcd: %v", err)
	}
	t.Cleanup(func() {
		e.Close()
		<-e.Server.StopNotify()
	})
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("embedded etcd failed: %v", err)
	case <-time.After(startTimeout):
		e.Server.Stop()
		t.Fatalf("embedded etcd not ready after %v", startTimeout)
	}
	return &Server{Etcd: e, Endpoints: []string{clientURL.String()}}
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
