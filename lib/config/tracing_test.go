package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTracingConfig: tracing.exporter, endpoint and sampling_rate are read
// and checked at start, each mistake named by its key; unset is off.
func TestTracingConfig(t *testing.T) {
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
	require.False(t, c.Tracing.Enabled())

	c, err = check("tracing: {exporter: otlp, endpoint: 'collector:4318', sampling_rate: 0.25}")
	require.NoError(t, err)
	require.True(t, c.Tracing.Enabled())
	require.Equal(t, "collector:4318", c.Tracing.Endpoint)
	require.InDelta(t, 0.25, *c.Tracing.SamplingRate, 1e-9)

	_, err = check("tracing: {exporter: otlp, endpoint: 'https://collector.example.com:4318'}")
	require.NoError(t, err)

	for yaml, want := range map[string]string{
		"tracing: {exporter: jaeger, endpoint: 'c:4318'}":                    `tracing.exporter "jaeger": want otlp`,
		"tracing: {exporter: otlp}":                                          "tracing.endpoint is required",
		"tracing: {exporter: otlp, endpoint: 'collector'}":                   `tracing.endpoint "collector": want HOST:PORT`,
		"tracing: {exporter: otlp, endpoint: 'grpc://c:4317'}":               `scheme "grpc"`,
		"tracing: {exporter: otlp, endpoint: 'https://c:4318/v1/traces'}":    "give HOST:PORT only",
		"tracing: {exporter: otlp, endpoint: 'c:4318', sampling_rate: 1.5}":  "tracing.sampling_rate 1.5: want a number from 0 to 1",
		"tracing: {exporter: otlp, endpoint: 'c:4318', sampling_rate: -0.1}": "tracing.sampling_rate -0.1",
		"tracing: {endpoint: 'c:4318'}":                                      "need tracing.exporter: otlp",
		"tracing: {exporter: otlp, endpoint: 'c:4318', sample: 1}":           "field sample not found",
	} {
		_, err := check(yaml)
		require.ErrorContains(t, err, want, yaml)
	}
}
