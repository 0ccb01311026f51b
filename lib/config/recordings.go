package config

import (
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gravitational/trace"
	"gopkg.in/yaml.v3"
)

// RecordingsConfig is where an auth server keeps session recordings
// (recordings: in postern.yaml). One auth server keeps them in a
// directory; several must share an S3-compatible bucket, or each reads
// back only the recordings its own nodes happened to upload to it.
type RecordingsConfig struct {
	// Dir is the directory; empty means DATA_DIR/auth/recordings.
	// Excludes S3.
	Dir string `yaml:"dir,omitempty"`
	// S3 keeps recordings in a bucket every auth server shares.
	S3 *S3Config `yaml:"s3,omitempty"`
	// Retention deletes recordings whose session started longer ago;
	// zero keeps them.
	Retention Retention `yaml:"retention,omitempty"`
}

// S3Config is an S3-compatible bucket. The credentials are read from
// files, so that postern.yaml can be world-readable and the keys kept
// 0600 (or a secrets mount).
type S3Config struct {
	// Endpoint is HOST:PORT of the S3 API (TLS), or http://HOST:PORT for
	// a gateway on loopback.
	Endpoint      string `yaml:"endpoint"`
	Bucket        string `yaml:"bucket"`
	Region        string `yaml:"region,omitempty"`
	AccessKeyFile string `yaml:"access_key_file"`
	SecretKeyFile string `yaml:"secret_key_file"`
	// TLSCAFile verifies the endpoint's certificate instead of the
	// system's roots.
	TLSCAFile string `yaml:"tls_ca_file,omitempty"`
	// PathStyle addresses the bucket as HOST/BUCKET (most self-hosted
	// servers) instead of BUCKET.HOST.
	PathStyle bool `yaml:"path_style,omitempty"`
	// Prefix goes before every object key; empty means the store's.
	Prefix string `yaml:"prefix,omitempty"`
}

// Retention is a duration that also takes days ("90d"), the unit
// retention policies are written in; Go durations stop at hours.
type Retention time.Duration

// MinRetention: a shorter retention is a typo (90s for 90d), and would
// delete sessions still being recorded.
const MinRetention = Retention(time.Hour)

// UnmarshalYAML reads "90d", "36h" or "0".
func (r *Retention) UnmarshalYAML(n *yaml.Node) error {
	d, err := ParseRetention(n.Value)
	if err != nil {
		return trace.BadParameter("recordings.retention: %v", err)
	}
	*r = d
	return nil
}

// MarshalYAML writes the form ParseRetention reads.
func (r Retention) MarshalYAML() (any, error) { return r.String(), nil }

// String is whole days when it is whole days, else a Go duration.
func (r Retention) String() string {
	d := time.Duration(r)
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}

// ParseRetention reads "90d", a Go duration ("36h") or "0" (keep).
func ParseRetention(s string) (Retention, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n <= 0 || n > 100*365 {
			return 0, trace.BadParameter("%q: want a number of days such as 90d, or a duration such as 36h", s)
		}
		return Retention(time.Duration(n) * 24 * time.Hour), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, trace.BadParameter("%q: want a number of days such as 90d, or a duration such as 36h", s)
	}
	return Retention(d), nil
}

// check validates the recordings config.
func (r *RecordingsConfig) check() error {
	if r.Retention != 0 && r.Retention < MinRetention {
		return trace.BadParameter("recordings.retention %s is shorter than %s: recordings of sessions still running would be deleted", r.Retention, MinRetention)
	}
	s := r.S3
	if s == nil {
		return nil
	}
	if r.Dir != "" {
		return trace.BadParameter("recordings: dir and s3 exclude each other: set one")
	}
	switch {
	case s.Endpoint == "":
		return trace.BadParameter("recordings.s3.endpoint: missing (HOST:PORT of the S3 API)")
	case s.Bucket == "":
		return trace.BadParameter("recordings.s3.bucket: missing")
	case s.AccessKeyFile == "" || s.SecretKeyFile == "":
		return trace.BadParameter("recordings.s3: access_key_file and secret_key_file are required (files holding the credentials)")
	}
	host := s.Endpoint
	if u, err := url.Parse(s.Endpoint); err == nil && u.Scheme != "" && u.Host != "" {
		if u.Scheme != "http" && u.Scheme != "https" {
			return trace.BadParameter("recordings.s3.endpoint %q: want HOST:PORT, https://HOST:PORT or http://HOST:PORT", s.Endpoint)
		}
		host = u.Host
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		return trace.BadParameter("recordings.s3.endpoint %q: want HOST:PORT, https://HOST:PORT or http://HOST:PORT", s.Endpoint)
	}
	return nil
}

// RecordingsDir is where an auth server without S3 keeps recordings.
func (c *Config) RecordingsDir() string {
	if c.Recordings.Dir != "" {
		return filepath.Clean(c.Recordings.Dir)
	}
	return c.AuthRecordingsDir()
}
