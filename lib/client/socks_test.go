package client

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseDynamicSpec: -D binds loopback unless told, and bad specs name
// what is wrong.
func TestParseDynamicSpec(t *testing.T) {
	for in, want := range map[string]DynamicSpec{
		"1080":           {BindHost: "127.0.0.1", BindPort: "1080"},
		"localhost:1080": {BindHost: "127.0.0.1", BindPort: "1080"},
		"*:1080":         {BindHost: "", BindPort: "1080"},
		"[::1]:1080":     {BindHost: "::1", BindPort: "1080"},
		"0.0.0.0:0":      {BindHost: "0.0.0.0", BindPort: "0"},
	} {
		got, err := ParseDynamicSpec(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "socks", "a:b:c", "70000", "[::1"} {
		_, err := ParseDynamicSpec(in)
		require.ErrorContains(t, err, "invalid -D", in)
	}
}
