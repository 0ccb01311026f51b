package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRecordingsConfig: recordings.dir, recordings.s3 and
// recordings.retention are read and checked at start, each mistake named
// by its key.
func TestRecordingsConfig(t *testing.T) {
	check := func(yaml string) (*Config, error) {
		fc, err := Parse([]byte(yaml))
		if err != nil {
			return nil, err
		}
		c := &Config{FileConfig: *fc}
		c.DataDir = t.TempDir()
		return c, c.CheckAndSetDefaults()
	}
	c, err := check("recordings:\n  s3:\n    endpoint: s3.example.com:443\n    bucket: b\n    access_key_file: /k\n    secret_key_file: /s\n    path_style: true\n  retention: 90d\n")
	require.NoError(t, err)
	require.Equal(t, Retention(90*24*time.Hour), c.Recordings.Retention)
	require.Equal(t, "b", c.Recordings.S3.Bucket)
	require.True(t, c.Recordings.S3.PathStyle)

	c, err = check("{}")
	require.NoError(t, err)
	require.Equal(t, c.AuthRecordingsDir(), c.RecordingsDir(), "a directory in the data dir by default")
	c, err = check("recordings: {dir: /srv/recordings, retention: 36h}")
	require.NoError(t, err)
	require.Equal(t, "/srv/recordings", c.RecordingsDir())
	require.Equal(t, Retention(36*time.Hour), c.Recordings.Retention)

	for yaml, want := range map[string]string{
		"recordings: {retention: 90days}": `recordings.retention: "90days"`,
		"recordings: {retention: 90s}":    "shorter than 1h0m0s",
		"recordings: {retention: -3d}":    `"-3d"`,
		"recordings: {dir: /x, s3: {endpoint: 'h:1', bucket: b, access_key_file: k, secret_key_file: s}}":   "dir and s3 exclude each other",
		"recordings: {s3: {bucket: b, access_key_file: k, secret_key_file: s}}":                             "recordings.s3.endpoint: missing",
		"recordings: {s3: {endpoint: 'h:1', access_key_file: k, secret_key_file: s}}":                       "recordings.s3.bucket: missing",
		"recordings: {s3: {endpoint: 'h:1', bucket: b}}":                                                    "access_key_file and secret_key_file are required",
		"recordings: {s3: {endpoint: 'ftp://h:1', bucket: b, access_key_file: k, secret_key_file: s}}":      `recordings.s3.endpoint "ftp://h:1"`,
		"recordings: {s3: {endpoint: nohost, bucket: b, access_key_file: k, secret_key_file: s}}":           `recordings.s3.endpoint "nohost"`,
		"recordings: {s3: {endpoint: 'h:1', bucket: b, access_key_file: k, secret_key_file: s, secret: x}}": "secret",
	} {
		_, err := check(yaml)
		require.ErrorContains(t, err, want, yaml)
	}
	require.Equal(t, "90d", Retention(90*24*time.Hour).String())
	require.Equal(t, "36h0m0s", Retention(36*time.Hour).String())
}
