package service

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTunnelAddrFor: where a node behind NAT dials the tunnel port,
// given the proxy_server it was told and the address the proxy
// announced.
func TestTunnelAddrFor(t *testing.T) {
	for _, tc := range []struct{ proxyServer, announced, want string }{
		// A wildcard listener: the host the node already reaches.
		{"proxy.example.com:3080", "0.0.0.0:3024", "proxy.example.com:3024"},
		{"proxy.example.com:3080", ":3024", "proxy.example.com:3024"},
		// The proxy's own loopback means nothing on another machine.
		{"proxy.example.com:3080", "127.0.0.1:3024", "proxy.example.com:3024"},
		// An explicit listen IP is dialed as announced.
		{"proxy.example.com:3080", "10.0.0.5:3024", "10.0.0.5:3024"},
		// On the proxy's machine, its loopback IP is exact.
		{"127.0.0.1:3080", "127.0.0.7:3024", "127.0.0.7:3024"},
		{"localhost:3080", "127.0.0.7:3024", "127.0.0.7:3024"},
	} {
		got, err := tunnelAddrFor(tc.proxyServer, tc.announced)
		require.NoError(t, err, "%+v", tc)
		require.Equal(t, tc.want, got, "%+v", tc)
	}
	_, err := tunnelAddrFor("proxy:3080", "")
	require.ErrorContains(t, err, "takes no reverse tunnels")
	_, err = tunnelAddrFor("proxy:3080", "no-port")
	require.ErrorContains(t, err, `bad tunnel address "no-port"`)
}
