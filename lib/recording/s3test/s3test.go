// Package s3test starts a real S3 server for tests: gofakes3
// (github.com/johannesboyne/gofakes3), an S3 implementation in Go served
// over HTTP on 127.0.0.1:0, in memory, with conditional writes
// (If-None-Match) done atomically under its bucket lock.
//
// It was chosen over SeaweedFS's S3 gateway because that one pulls about
// 500 modules into go.mod and minutes of compiling on a shared 2-core
// machine, for a volume server, a filer and a master that tests would have
// to start and wait for; gofakes3 adds a handful of small modules and
// starts in microseconds. What it does not do is check SigV4 signatures,
// so the handler in front of it checks that each request is signed with
// the test's access key (the part of authentication the client's config
// decides), answering AccessDenied as S3 does otherwise.
package s3test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/require"
)

// Options shape the server.
type Options struct {
	// TLS serves HTTPS with httptest's certificate for 127.0.0.1 (its CA
	// in CAFile); otherwise plain HTTP (Endpoint is http://...).
	TLS bool
	// IgnoreConditionalWrites drops If-None-Match and If-Match from
	// writes, as a server without conditional writes behaves.
	IgnoreConditionalWrites bool
	// NoBucket leaves the bucket uncreated.
	NoBucket bool
}

// Server is a running S3 server with one bucket.
type Server struct {
	// Endpoint is what recordings.s3.endpoint says: HOST:PORT with TLS,
	// http://HOST:PORT without.
	Endpoint string
	Bucket   string
	Region   string
	// AccessKey and SecretKey are the credentials, also written to
	// AccessKeyFile and SecretKeyFile.
	AccessKey, SecretKey         string
	AccessKeyFile, SecretKeyFile string
	// CAFile is the PEM certificate a TLS server is verified with.
	CAFile string

	backend *s3mem.Backend
	srv     *httptest.Server
	// requests counts the requests served.
	requests atomic.Int64
}

// credentialRe finds the access key in a SigV4 Authorization header.
var credentialRe = regexp.MustCompile(`Credential=([^/]+)/`)

// Start starts a server; it is closed when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s := &Server{Bucket: "postern-recordings", Region: "us-east-1", AccessKey: randomKey(), SecretKey: randomKey()}
	s.backend = s3mem.New()
	if !opts.NoBucket {
		require.NoError(t, s.backend.CreateBucket(s.Bucket))
	}
	fake := gofakes3.New(s.backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	inner := fake.Server()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		m := credentialRe.FindStringSubmatch(r.Header.Get("Authorization"))
		if m == nil || m[1] != s.AccessKey {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>`))
			return
		}
		if opts.IgnoreConditionalWrites && r.Method == http.MethodPut {
			r.Header.Del("If-None-Match")
			r.Header.Del("If-Match")
		}
		inner.ServeHTTP(w, r)
	})
	s.srv = httptest.NewUnstartedServer(handler)
	dir := t.TempDir()
	if opts.TLS {
		s.srv.StartTLS()
		s.Endpoint = s.srv.Listener.Addr().String()
		s.CAFile = filepath.Join(dir, "ca.pem")
		cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
		require.NoError(t, os.WriteFile(s.CAFile, cert, 0o600))
	} else {
		s.srv.Start()
		s.Endpoint = "http://" + s.srv.Listener.Addr().String()
	}
	t.Cleanup(s.Close)
	s.AccessKeyFile = filepath.Join(dir, "access_key")
	s.SecretKeyFile = filepath.Join(dir, "secret_key")
	require.NoError(t, os.WriteFile(s.AccessKeyFile, []byte(s.AccessKey+"\n"), 0o600))
	require.NoError(t, os.WriteFile(s.SecretKeyFile, []byte(s.SecretKey+"\n"), 0o600))
	return s
}

// Close stops the server (idempotent).
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Requests is how many requests the server has answered.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Keys lists the object keys under prefix in the bucket, straight from
// the server's storage.
func (s *Server) Keys(t testing.TB, prefix string) []string {
	t.Helper()
	res, err := s.backend.ListBucket(s.Bucket, &gofakes3.Prefix{Prefix: prefix, HasPrefix: true}, gofakes3.ListBucketPage{})
	require.NoError(t, err)
	var out []string
	for _, o := range res.Contents {
		out = append(out, o.Key)
	}
	return out
}

// Put writes an object straight into the server's storage (tests that
// tamper with or plant objects).
func (s *Server) Put(t testing.TB, key string, data []byte) {
	t.Helper()
	_, err := s.backend.PutObject(s.Bucket, key, map[string]string{}, strings.NewReader(string(data)), int64(len(data)), nil)
	require.NoError(t, err)
}

func randomKey() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
