// Package s3store keeps session recordings in an S3-compatible bucket,
// the storage every auth server of a cluster shares: each one reads every
// recording, whichever auth server a node uploaded it through, and losing
// an auth server's disk loses no recording.
//
// Layout. One object per chunk, PREFIX SESSION/NNNNNNNN.chunk, holding the
// chunk as JSON (the same bytes as a chunk file of the directory store),
// so a bucket copied to disk is a directory store.
//
// Concurrent writers. Chunks never change once stored (recording.Storage).
// PutChunk writes with If-None-Match: * (a conditional write: the server
// refuses it when the key exists), then compares what is stored with what
// it brought. New checks at start whether the server honours the header
// (it writes a probe object twice); a server that ignores it gets a check
// before the write and a read-back after it instead, which closes the gap
// to the two writes' round trips: two auth servers storing different
// chunks of one index at the same instant could still race there (only a
// misbehaving node sends two), so a warning says so.
package s3store

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
)

// DefaultPrefix is where recordings live in the bucket, so that a bucket
// shared with other data keeps them apart.
const DefaultPrefix = "recordings/"

// maxChunkObject bounds one chunk object as read back: a chunk is under
// 600 KiB as JSON (lib/auth, maxRequestBody); anything far larger is not
// ours.
const maxChunkObject = 8 << 20

// listConcurrency bounds the reads List makes at once (first and last
// chunks of recordings not cached yet): enough to hide round trips,
// few enough not to flood the server.
const listConcurrency = 8

// maxCached bounds the per-session cache (headers of first chunks and
// which recordings are complete, both immutable once stored): a few
// hundred bytes each, so about ten MiB at the cap.
const maxCached = 50000

// Config configures a Store. Each field names the auth config key it
// comes from (recordings.s3.*).
type Config struct {
	// Endpoint is the S3 API's HOST:PORT (endpoint), spoken over TLS;
	// http://HOST:PORT is plain HTTP, for a gateway on loopback. Required.
	Endpoint string
	// Bucket must exist (bucket). Required.
	Bucket string
	// Region is the bucket's region (region); empty lets the client ask.
	Region string
	// AccessKey and SecretKey are the credentials (the contents of
	// access_key_file and secret_key_file). Required.
	AccessKey, SecretKey string
	// RootCAs verifies the endpoint's certificate (tls_ca_file); nil
	// means the system's roots.
	RootCAs *x509.CertPool
	// PathStyle addresses the bucket as HOST/BUCKET rather than
	// BUCKET.HOST (path_style): what most self-hosted servers need.
	PathStyle bool
	// Prefix goes before every key; empty means DefaultPrefix.
	Prefix string
	// Deps: only Logger is used.
	observe.Deps
}

// CheckAndSetDefaults validates the config.
func (c *Config) CheckAndSetDefaults() error {
	if c.Endpoint == "" {
		return trace.BadParameter("recordings.s3.endpoint: missing (HOST:PORT of the S3 API)")
	}
	if c.Bucket == "" {
		return trace.BadParameter("recordings.s3.bucket: missing")
	}
	if c.AccessKey == "" || c.SecretKey == "" {
		return trace.BadParameter("recordings.s3: missing credentials (access_key_file and secret_key_file)")
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	c.Deps.SetDefaults(observe.ComponentRecordingS3)
	return nil
}

// Store is a recording.Storage on an S3 bucket.
type Store struct {
	cfg Config
	clt *minio.Client
	tr  *http.Transport
	// conditional is whether the server honours If-None-Match on PUT
	// (probed by New).
	conditional bool

	// mu guards the caches; never held across a request.
	mu sync.Mutex
	// headers are first chunks' headers by session.
	headers map[string]recording.Header
	// complete are recordings whose final chunk is stored, by session:
	// their chunk count.
	complete map[string]int
}

var _ recording.Storage = (*Store)(nil)

// New connects to the bucket and checks, before the auth server serves
// anything, that it is usable: the endpoint answers, the bucket exists,
// the credentials may write and delete there. Each failure names the
// config key to look at.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, trace.Wrap(err)
	}
	host, secure, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	if secure {
		tr.TLSClientConfig = &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	clt, err := minio.New(host, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:       secure,
		Transport:    tr,
		Region:       cfg.Region,
		BucketLookup: lookup,
		// Few retries: a chunk upload that fails is retried by the
		// node, and start-up should say soon that the endpoint is down.
		MaxRetries: 3,
	})
	if err != nil {
		return nil, trace.BadParameter("recordings.s3.endpoint %q: %v", cfg.Endpoint, err)
	}
	s := &Store{cfg: cfg, clt: clt, tr: tr, headers: map[string]recording.Header{}, complete: map[string]int{}}
	if err := s.check(ctx); err != nil {
		tr.CloseIdleConnections()
		return nil, trace.Wrap(err)
	}
	return s, nil
}

// parseEndpoint splits HOST:PORT or http(s)://HOST:PORT.
func parseEndpoint(ep string) (host string, secure bool, err error) {
	secure = true
	if strings.Contains(ep, "://") {
		u, perr := url.Parse(ep)
		if perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return "", false, trace.BadParameter("recordings.s3.endpoint %q: want HOST:PORT, https://HOST:PORT or http://HOST:PORT", ep)
		}
		ep, secure = u.Host, u.Scheme == "https"
	}
	if _, _, err := net.SplitHostPort(ep); err != nil {
		return "", false, trace.BadParameter("recordings.s3.endpoint %q: want HOST:PORT", ep)
	}
	return ep, secure, nil
}

// Close drops the idle connections.
func (s *Store) Close() error {
	s.tr.CloseIdleConnections()
	return nil
}

// Conditional reports whether the server honours conditional writes.
func (s *Store) Conditional() bool { return s.conditional }

// checkTimeout bounds the start-up check: an endpoint that does not
// answer in this long is reported as unreachable.
const checkTimeout = 15 * time.Second

// check proves the bucket usable and probes conditional writes: a probe
// object written twice with If-None-Match: * must be refused the second
// time.
func (s *Store) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	ok, err := s.clt.BucketExists(ctx, s.cfg.Bucket)
	if err != nil {
		return s.convert(err, "checking bucket "+s.cfg.Bucket)
	}
	if !ok {
		return trace.BadParameter("recordings.s3.bucket %q does not exist at %s (create it first)", s.cfg.Bucket, s.cfg.Endpoint)
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	key := s.cfg.Prefix + ".probe/" + hex.EncodeToString(id)
	put := func() error {
		opts := minio.PutObjectOptions{ContentType: "text/plain"}
		opts.SetMatchETagExcept("*")
		_, err := s.clt.PutObject(ctx, s.cfg.Bucket, key, strings.NewReader("postern write probe"), 19, opts)
		return err
	}
	if err := put(); err != nil {
		if !isNotImplemented(err) {
			return s.convert(err, "writing a probe object to bucket "+s.cfg.Bucket)
		}
		// Refused outright: write without the condition.
		if _, err := s.clt.PutObject(ctx, s.cfg.Bucket, key, strings.NewReader("postern write probe"), 19, minio.PutObjectOptions{}); err != nil {
			return s.convert(err, "writing a probe object to bucket "+s.cfg.Bucket)
		}
	} else {
		err := put()
		switch {
		case isPreconditionFailed(err):
			s.conditional = true
		case err != nil && !isNotImplemented(err):
			return s.convert(err, "writing a probe object to bucket "+s.cfg.Bucket)
		}
	}
	if err := s.clt.RemoveObject(ctx, s.cfg.Bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return s.convert(err, "deleting the probe object from bucket "+s.cfg.Bucket+" (retention deletes)")
	}
	if !s.conditional {
		s.cfg.Logger.WithField("endpoint", s.cfg.Endpoint).Warn("The S3 server ignores conditional writes (If-None-Match); chunks are checked before and read back after each write instead.")
	}
	return nil
}

func (s *Store) key(session string, i int) string {
	return fmt.Sprintf("%s%s/%08d.chunk", s.cfg.Prefix, session, i)
}

// PutChunk stores c unless chunk c.Index is stored (recording.Storage).
func (s *Store) PutChunk(ctx context.Context, session string, c recording.Chunk) error {
	if err := recording.CheckSessionID(session); err != nil {
		return trace.Wrap(err)
	}
	if c.Index < 0 {
		return trace.BadParameter("chunk index %d", c.Index)
	}
	data, err := json.Marshal(c)
	if err != nil {
		return trace.Wrap(err)
	}
	key := s.key(session, c.Index)
	opts := minio.PutObjectOptions{ContentType: "application/json"}
	if s.conditional {
		opts.SetMatchETagExcept("*")
	} else {
		have, err := s.getObject(ctx, key)
		if err == nil {
			return trace.Wrap(recording.SameChunk(session, c, have))
		}
		if !trace.IsNotFound(err) {
			return trace.Wrap(err)
		}
	}
	_, err = s.clt.PutObject(ctx, s.cfg.Bucket, key, bytes.NewReader(data), int64(len(data)), opts)
	if err != nil && !isPreconditionFailed(err) {
		return s.convert(err, "storing chunk "+strconv.Itoa(c.Index)+" of "+session)
	}
	if err == nil && s.conditional {
		return nil
	}
	// Another writer had it (the condition failed), or the server cannot
	// tell (read back what won).
	have, gerr := s.getObject(ctx, key)
	if gerr != nil {
		return trace.Wrap(gerr)
	}
	return trace.Wrap(recording.SameChunk(session, c, have))
}

// getObject reads one object whole (bounded by maxChunkObject).
func (s *Store) getObject(ctx context.Context, key string) ([]byte, error) {
	obj, err := s.clt.GetObject(ctx, s.cfg.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.convert(err, "reading "+key)
	}
	defer obj.Close()
	data, err := io.ReadAll(io.LimitReader(obj, maxChunkObject+1))
	if err != nil {
		return nil, s.convert(err, "reading "+key)
	}
	if len(data) > maxChunkObject {
		return nil, trace.BadParameter("%s is larger than %d bytes: not a chunk", key, maxChunkObject)
	}
	return data, nil
}

// ChunkIndexes lists the stored chunk indexes of session, ascending; a
// session with none is NotFound.
func (s *Store) ChunkIndexes(ctx context.Context, session string) ([]int, error) {
	if err := recording.CheckSessionID(session); err != nil {
		return nil, trace.Wrap(err)
	}
	var out []int
	prefix := s.cfg.Prefix + session + "/"
	for obj := range s.clt.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, s.convert(obj.Err, "listing "+prefix)
		}
		if i, ok := chunkIndex(strings.TrimPrefix(obj.Key, prefix)); ok {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		return nil, trace.NotFound("recording %s not found", session)
	}
	sort.Ints(out)
	return out, nil
}

// chunkIndex parses NNNNNNNN.chunk.
func chunkIndex(name string) (int, bool) {
	base, ok := strings.CutSuffix(name, ".chunk")
	if !ok || base == "" || strings.Contains(base, "/") {
		return 0, false
	}
	n, err := strconv.Atoi(base)
	return n, err == nil && n >= 0
}

// GetChunk reads chunk i of session.
func (s *Store) GetChunk(ctx context.Context, session string, i int) (*recording.Chunk, error) {
	if err := recording.CheckSessionID(session); err != nil {
		return nil, trace.Wrap(err)
	}
	if i < 0 {
		return nil, trace.BadParameter("chunk index %d", i)
	}
	data, err := s.getObject(ctx, s.key(session, i))
	if err != nil {
		return nil, trace.Wrap(err)
	}
	var c recording.Chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, trace.BadParameter("chunk %d of %s is unreadable: %v", i, session, err)
	}
	if c.Index != i {
		return nil, trace.BadParameter("chunk object %d of %s says it is chunk %d", i, session, c.Index)
	}
	return &c, nil
}

// LastChunk is the highest-indexed stored chunk of session.
func (s *Store) LastChunk(ctx context.Context, session string) (*recording.ChunkRef, error) {
	idx, err := s.ChunkIndexes(ctx, session)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	c, err := s.GetChunk(ctx, session, idx[len(idx)-1])
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return &recording.ChunkRef{Index: c.Index, Hash: c.Hash, Final: c.Final}, nil
}

// GetMeta reads the header from chunk 0 and whether the last is final.
func (s *Store) GetMeta(ctx context.Context, session string) (*recording.Meta, error) {
	idx, err := s.ChunkIndexes(ctx, session)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	return s.meta(ctx, session, idx)
}

// meta builds a session's Meta from its stored indexes, reading its first
// and last chunks unless cached.
func (s *Store) meta(ctx context.Context, session string, idx []int) (*recording.Meta, error) {
	if len(idx) == 0 || idx[0] != 0 {
		return nil, trace.NotFound("recording %s has no first chunk", session)
	}
	s.mu.Lock()
	h, haveHeader := s.headers[session]
	n, complete := s.complete[session]
	s.mu.Unlock()
	if !haveHeader {
		c, err := s.GetChunk(ctx, session, 0)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		hp, err := recording.HeaderOf(c.Data)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		h = *hp
		s.remember(func() { s.headers[session] = h })
	}
	m := &recording.Meta{Header: h, Chunks: len(idx)}
	if complete && n == len(idx) {
		m.Complete = true
		return m, nil
	}
	if last, err := s.GetChunk(ctx, session, idx[len(idx)-1]); err == nil && last.Final {
		m.Complete = true
		s.remember(func() { s.complete[session] = len(idx) })
	}
	return m, nil
}

// remember runs fn under mu, emptying the caches first when they are
// full (they are refilled from the bucket as needed).
func (s *Store) remember(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.headers)+len(s.complete) >= maxCached {
		s.headers = map[string]recording.Header{}
		s.complete = map[string]int{}
	}
	fn()
}

// List returns every stored recording's metadata, oldest first, from one
// listing of the bucket; recordings whose first chunk is missing or
// unreadable are skipped.
func (s *Store) List(ctx context.Context) ([]recording.Meta, error) {
	sessions := map[string][]int{}
	for obj := range s.clt.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.cfg.Prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, s.convert(obj.Err, "listing recordings")
		}
		session, name, ok := strings.Cut(strings.TrimPrefix(obj.Key, s.cfg.Prefix), "/")
		if !ok || recording.CheckSessionID(session) != nil {
			continue
		}
		if i, ok := chunkIndex(name); ok {
			sessions[session] = append(sessions[session], i)
		}
	}
	var (
		mu  sync.Mutex
		out = []recording.Meta{}
		wg  sync.WaitGroup
		sem = make(chan struct{}, listConcurrency)
	)
	for session, idx := range sessions {
		sort.Ints(idx)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			m, err := s.meta(ctx, session, idx)
			if err != nil {
				return
			}
			mu.Lock()
			out = append(out, *m)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, trace.Wrap(err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Timestamp != out[j].Timestamp {
			return out[i].Timestamp < out[j].Timestamp
		}
		return out[i].SessionID < out[j].SessionID
	})
	return out, nil
}

// DeleteRecording removes every chunk of session, the first chunk last:
// a delete cut short leaves a recording that is still listed (and so
// found again by the next retention pass), never headless chunks.
func (s *Store) DeleteRecording(ctx context.Context, session string) error {
	idx, err := s.ChunkIndexes(ctx, session)
	if trace.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return trace.Wrap(err)
	}
	s.mu.Lock()
	delete(s.headers, session)
	delete(s.complete, session)
	s.mu.Unlock()
	for k := len(idx) - 1; k >= 0; k-- {
		if err := s.clt.RemoveObject(ctx, s.cfg.Bucket, s.key(session, idx[k]), minio.RemoveObjectOptions{}); err != nil {
			return s.convert(err, "deleting chunk "+strconv.Itoa(idx[k])+" of "+session)
		}
	}
	return nil
}

// convert classifies an S3 client error, naming the config key that
// would fix it.
func (s *Store) convert(err error, doing string) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return trace.ConnectionProblem(err, "recordings.s3.endpoint %s did not answer in time (%s): %v", s.cfg.Endpoint, doing, err)
	case errors.Is(err, context.Canceled):
		return trace.Wrap(err)
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "NoSuchKey":
		return trace.NotFound("%s: not found", doing)
	case "NoSuchBucket":
		return trace.NotFound("recordings.s3.bucket %q does not exist at %s", s.cfg.Bucket, s.cfg.Endpoint)
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken":
		return trace.AccessDenied("recordings.s3: %s refused by %s (%s: %s): check access_key_file, secret_key_file and the key's rights on bucket %q",
			doing, s.cfg.Endpoint, resp.Code, resp.Message, s.cfg.Bucket)
	case "AuthorizationHeaderMalformed":
		return trace.BadParameter("recordings.s3.region %q: %s says %s", s.cfg.Region, s.cfg.Endpoint, resp.Message)
	case "ConditionalRequestConflict":
		// Another conditional write of the key is in flight: retrying
		// settles it (the node retries its upload).
		return trace.ConnectionProblem(err, "%s: a concurrent write is in progress; retry", doing)
	}
	if resp.StatusCode == 0 {
		var uerr *url.Error
		var ne net.Error
		var cerr *tls.CertificateVerificationError
		switch {
		case errors.As(err, &cerr):
			return trace.ConnectionProblem(err, "recordings.s3.endpoint %s: its certificate does not verify (set recordings.s3.tls_ca_file?): %v", s.cfg.Endpoint, err)
		case errors.As(err, &uerr), errors.As(err, &ne):
			return trace.ConnectionProblem(err, "recordings.s3.endpoint %s is unreachable (%s): %v", s.cfg.Endpoint, doing, err)
		}
	}
	return trace.Wrap(err, "recordings.s3 %s (%s)", s.cfg.Endpoint, doing)
}

func isPreconditionFailed(err error) bool {
	return err != nil && minio.ToErrorResponse(err).Code == "PreconditionFailed"
}

func isNotImplemented(err error) bool {
	if err == nil {
		return false
	}
	r := minio.ToErrorResponse(err)
	return r.Code == "NotImplemented" || r.StatusCode == http.StatusNotImplemented
}
