package s3store

import (
	"context"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/recording/s3test"
)

// TestNewRefusesUnusableStores: every way the store cannot work is found
// at start, with an error naming the config key to fix.
func TestNewRefusesUnusableStores(t *testing.T) {
	ctx := context.Background()
	srv := s3test.Start(t, s3test.Options{})
	tlsSrv := s3test.Start(t, s3test.Options{TLS: true})
	noBucket := s3test.Start(t, s3test.Options{NoBucket: true})
	for _, tc := range []struct {
		name  string
		cfg   func() Config
		check func(error) bool
		want  string
	}{
		{"missing endpoint", func() Config { c := configFor(t, srv); c.Endpoint = ""; return c }, trace.IsBadParameter, "recordings.s3.endpoint: missing"},
		{"bad endpoint", func() Config { c := configFor(t, srv); c.Endpoint = "ftp://x:1"; return c }, trace.IsBadParameter, "recordings.s3.endpoint"},
		{"missing bucket key", func() Config { c := configFor(t, srv); c.Bucket = ""; return c }, trace.IsBadParameter, "recordings.s3.bucket: missing"},
		{"no such bucket", func() Config { return configFor(t, noBucket) }, trace.IsBadParameter, `recordings.s3.bucket "postern-recordings" does not exist`},
		{"missing credentials", func() Config { c := configFor(t, srv); c.SecretKey = ""; return c }, trace.IsBadParameter, "secret_key_file"},
		{"wrong access key", func() Config { c := configFor(t, srv); c.AccessKey = "someone-else"; return c }, trace.IsAccessDenied, "check access_key_file, secret_key_file"},
		{"unreachable endpoint", func() Config { c := configFor(t, srv); c.Endpoint = "http://" + freeport.RefusedAddr(t); return c }, trace.IsConnectionProblem, "is unreachable"},
		{"TLS without its CA", func() Config { c := configFor(t, tlsSrv); c.RootCAs = nil; return c }, trace.IsConnectionProblem, "tls_ca_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := New(ctx, tc.cfg())
			if err == nil {
				st.Close()
			}
			require.Error(t, err)
			require.True(t, tc.check(err), "%T %v", trace.Unwrap(err), err)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestConditionalWritesProbed: New finds out whether the server honours
// If-None-Match.
func TestConditionalWritesProbed(t *testing.T) {
	require.True(t, openS3(t, s3test.Start(t, s3test.Options{})).Conditional())
	srv := s3test.Start(t, s3test.Options{IgnoreConditionalWrites: true})
	require.False(t, openS3(t, srv).Conditional())
	require.Empty(t, srv.Keys(t, ""), "the probe object is removed")
}
