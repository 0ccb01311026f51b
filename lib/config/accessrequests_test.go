package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAccessRequestsConfig: access_requests.webhook and ca_file are
// checked at start, each mistake named by its key.
func TestAccessRequestsConfig(t *testing.T) {
	check := func(yaml string) (*Config, error) {
		fc, err := Parse([]byte(yaml))
		if err != nil {
			return nil, err
		}
		c := &Config{FileConfig: *fc}
		c.DataDir = t.TempDir()
		return c, c.CheckAndSetDefaults()
	}
	c, err := check("access_requests: {webhook: 'https://chat.example.com/hook', ca_file: ca.pem}\n")
	require.NoError(t, err)
	require.Equal(t, "https://chat.example.com/hook", c.AccessRequests.ExportConfig().Webhook)
	for yaml, want := range map[string]string{
		"access_requests: {webhook: 'http://chat.example.com/in'}": `access_requests.webhook "http://chat.example.com/in"`,
		"access_requests: {ca_file: /x.pem}":                       "access_requests.ca_file is for the webhook",
		"access_requests: {webhok: x}":                             "webhok",
	} {
		_, err := check(yaml)
		require.ErrorContains(t, err, want, yaml)
	}
}
