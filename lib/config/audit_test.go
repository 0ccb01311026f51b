package config

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAuditConfig: audit.file, audit.webhook, audit.format and
// audit.ca_file are read and checked at start, each mistake named by its
// key; an unknown key under audit is refused.
func TestAuditConfig(t *testing.T) {
	check := func(yaml string) (*Config, error) {
		fc, err := Parse([]byte(yaml))
		if err != nil {
			return nil, err
		}
		c := &Config{FileConfig: *fc}
		c.DataDir = t.TempDir()
		return c, c.CheckAndSetDefaults()
	}
	c, err := check("{}")
	require.NoError(t, err)
	require.Empty(t, c.Audit.ExportConfig().File)
	require.Empty(t, c.Audit.ExportConfig().Webhook)

	c, err = check("audit:\n  file: rel/audit.jsonl\n  format: json\n  webhook: https://siem.example.com/in\n  ca_file: /etc/siem-ca.pem\n")
	require.NoError(t, err)
	abs, err := filepath.Abs("rel/audit.jsonl")
	require.NoError(t, err)
	x := c.Audit.ExportConfig()
	require.Equal(t, abs, x.File)
	require.Equal(t, "https://siem.example.com/in", x.Webhook)
	require.Equal(t, "/etc/siem-ca.pem", x.CAFile)

	c, err = check("audit: {webhook: 'http://127.0.0.1:9000/'}")
	require.NoError(t, err)
	require.Equal(t, AuditFormatJSON, c.Audit.Format)

	for yaml, want := range map[string]string{
		"audit: {file: /x, format: csv}":                     `audit.format "csv": want json`,
		"audit: {webhook: 'siem:443'}":                       `audit.webhook "siem:443"`,
		"audit: {webhook: 'http://siem.example.com/in'}":     "audit.webhook \"http://siem.example.com/in\": plain http is only for a collector on loopback",
		"audit: {file: /x, ca_file: /ca.pem}":                "audit.ca_file is for the webhook",
		"audit: {file: /x, hook: 'https://h/'}":              "field hook not found",
		"audit: {webhook: 'https://h/', max_size_bytes: 10}": "audit.max_size_bytes and audit.max_files rotate audit.file: set audit.file too",
		"audit: {file: /x, max_files: 3}":                    "audit.max_files keeps files rotated by size: set audit.max_size_bytes too",
		"audit: {file: /x, max_size_bytes: -1}":              "must not be negative",
	} {
		_, err := check(yaml)
		require.ErrorContains(t, err, want, yaml)
	}
}
