package service

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPublicWebAddrs: public_addrs first (a bare name is the web port, or
// 443 behind a load balancer), then the listener and its certificate names.
func TestPublicWebAddrs(t *testing.T) {
	listen := &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 3080}
	got := publicWebAddrs([]string{"proxy.example.com", "lb.example.com:443", "::1"}, listen, []string{"127.0.0.1", "host1"})
	require.Equal(t, []string{
		"proxy.example.com:3080", "proxy.example.com", "lb.example.com:443", "[::1]:3080", "[::1]",
		"127.0.0.1:3080", "host1:3080",
	}, got)
	require.Equal(t, []string{"127.0.0.1:3080"}, publicWebAddrs(nil, listen, []string{"127.0.0.1"}))
}
