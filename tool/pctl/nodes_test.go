package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// TestNodesTableEscapes: node-supplied text (labels, hostnames) reaches
// the admin's terminal escaped, never as raw control characters.
func TestNodesTableEscapes(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, writeNodesTable(&out, []services.Node{{
		UUID: "u1", Hostname: "web\x1b]0;pwned\x07", Addr: "10.0.0.1:3022",
		Labels:        map[string]string{"env": "\x1b[31m\r\n", "a": "1"},
		LastHeartbeat: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
	}, {UUID: "u2", Hostname: "db", Addr: "10.0.0.2:3022"}, {UUID: "u3", Hostname: "nat", Tunnel: true},
		{UUID: "u4", Hostname: "legacy", Addr: "10.0.0.4:22", Kind: services.NodeKindOpenSSH}}, nil))
	s := out.String()
	require.Contains(t, s, `a=1,env="\x1b[31m\r\n"`)
	require.Contains(t, s, `"web\x1b]0;pwned\a"`)
	require.NotContains(t, s, "\x1b")
	require.NotContains(t, s, "\r")
	require.NotContains(t, s, "\x07")
	require.Equal(t, 5, bytes.Count(out.Bytes(), []byte("\n")), "one line per node plus the header:\n%s", s)
	// A node behind NAT has no address: the column says why.
	require.Regexp(t, `(?m)^nat +u3 +\(tunnel\) `, s)
	// Kind and status come last; an OpenSSH server never heartbeats, and
	// with no live proxy to vouch for it its status is unknown.
	require.Regexp(t, `(?m)^HOSTNAME +UUID +ADDRESS +LABELS +LAST HEARTBEAT +KIND +STATUS$`, s)
	require.Regexp(t, `(?m)^db +u2 +10\.0\.0\.2:3022 +- +\S+ +postern +online$`, s)
	require.Regexp(t, `(?m)^legacy +u4 +10\.0\.0\.4:22 +- +- +openssh +unknown$`, s)
}

// TestNodeStatus: an OpenSSH node is offline only when every live proxy
// reports it so.
func TestNodeStatus(t *testing.T) {
	ossh := services.Node{UUID: "u4", Kind: services.NodeKindOpenSSH}
	down := services.Proxy{UUID: "p1", OfflineOpenSSH: []string{"u3", "u4"}}
	up := services.Proxy{UUID: "p2", OfflineOpenSSH: []string{"u3"}}
	require.Equal(t, nodeOnline, nodeStatus(services.Node{UUID: "u1"}, nil), "a Postern node listed is heartbeating")
	require.Equal(t, nodeUnknown, nodeStatus(ossh, nil))
	require.Equal(t, nodeOffline, nodeStatus(ossh, []services.Proxy{down}))
	require.Equal(t, nodeOnline, nodeStatus(ossh, []services.Proxy{down, up}), "one proxy reaches it")
}
