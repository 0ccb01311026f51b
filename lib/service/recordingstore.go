package service

import (
	"context"
	"crypto/x509"
	"os"
	"strings"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/recording/s3store"
)

// openRecordings opens the auth server's recording store (recordings:
// in postern.yaml): a directory, or an S3 bucket that every auth server
// of the cluster shares, and starts retention when one is set. An S3
// store is checked before auth serves anything (s3store.New): a wrong
// endpoint, bucket or key stops the start naming the setting, instead of
// failing every upload later.
func (p *Process) openRecordings(ctx context.Context) (recording.Storage, error) {
	rc := p.cfg.Recordings
	var store recording.Storage
	if s := rc.S3; s != nil {
		access, err := readSecretFile("recordings.s3.access_key_file", s.AccessKeyFile)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		secret, err := readSecretFile("recordings.s3.secret_key_file", s.SecretKeyFile)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		var roots *x509.CertPool
		if s.TLSCAFile != "" {
			pem, err := os.ReadFile(s.TLSCAFile)
			if err != nil {
				return nil, trace.BadParameter("recordings.s3.tls_ca_file: %v", err)
			}
			roots = x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return nil, trace.BadParameter("recordings.s3.tls_ca_file %s holds no PEM certificate", s.TLSCAFile)
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		st, err := s3store.New(sctx, s3store.Config{
			Endpoint: s.Endpoint, Bucket: s.Bucket, Region: s.Region,
			AccessKey: access, SecretKey: secret, RootCAs: roots,
			PathStyle: s.PathStyle, Prefix: s.Prefix,
			Deps: p.deps(observe.ComponentRecordingS3, nil),
		})
		if err != nil {
			return nil, trace.Wrap(err)
		}
		p.onShutdown(func(context.Context) error { return st.Close() })
		p.log.WithField("endpoint", s.Endpoint).WithField("bucket", s.Bucket).Info("Recordings are kept in S3.")
		store = st
	} else {
		store = recording.DirStorage{Dir: p.cfg.RecordingsDir()}
	}
	if rc.Retention > 0 {
		ret, err := recording.NewRetention(recording.RetentionConfig{
			Store:  store,
			MaxAge: time.Duration(rc.Retention),
			Deps:   p.deps(observe.ComponentRetention, nil),
			Deleted: func(ctx context.Context, sessions []string) {
				// What was deleted, and why, stays in the record after
				// the recordings are gone.
				for _, id := range sessions {
					p.audit.Emit(ctx, events.Event{Type: events.RecordingDeleted, Fields: events.Fields{
						events.FieldSessionID: id, events.FieldReason: "older than recordings.retention " + rc.Retention.String(),
					}})
				}
			},
		})
		if err != nil {
			return nil, trace.Wrap(err)
		}
		p.onShutdown(func(context.Context) error { return ret.Close() })
	}
	return store, nil
}

// readSecretFile reads a credential from a file, trimmed of the newline
// editors add.
func readSecretFile(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", trace.BadParameter("%s: %v", key, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", trace.BadParameter("%s: %s is empty", key, path)
	}
	return v, nil
}
