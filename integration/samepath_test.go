package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/freeport"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
)

// routeOutcome is what one path made of a target: the SSH banner of the node
// it reached, or the error text it showed the user.
type routeOutcome struct {
	banner string
	err    string
}

// viaSubsystem opens proxy:TARGET on the proxy and reads the first line
// the node sends, or the error on the channel's stderr.
func (c *allInOne) viaSubsystem(t *testing.T, target string) routeOutcome {
	t.Helper()
	proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), c.clientConfig(t))
	require.NoError(t, err)
	defer proxy.Close()
	s, err := proxy.NewSession()
	require.NoError(t, err)
	defer s.Close()
	// RequestSubsystem does not start x/crypto's copy goroutines, so read
	// both streams through pipes.
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	stderr, err := s.StderrPipe()
	require.NoError(t, err)
	if err := s.RequestSubsystem("proxy:" + target); err != nil {
		return routeOutcome{err: err.Error()}
	}
	line := make([]byte, 8)
	if _, err := io.ReadFull(stdout, line); err == nil {
		return routeOutcome{banner: string(line)}
	}
	msg, _ := io.ReadAll(stderr)
	return routeOutcome{err: string(msg)}
}

// viaDirectTCPIP opens a direct-tcpip channel, as ssh -J does.
func (c *allInOne) viaDirectTCPIP(t *testing.T, target string) routeOutcome {
	t.Helper()
	proxy, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), c.clientConfig(t))
	require.NoError(t, err)
	defer proxy.Close()
	conn, err := proxy.Dial("tcp", target)
	if err != nil {
		return routeOutcome{err: err.Error()}
	}
	defer conn.Close()
	line := make([]byte, 8)
	_, err = io.ReadFull(conn, line)
	require.NoError(t, err)
	return routeOutcome{banner: string(line)}
}

// TestSameAnswerOnEveryPath walks one set of targets through the proxy
// subsystem, direct-tcpip and `pctl route`: they share one Router, so they
// must agree on the node, on "not found", and on the ambiguous-host list.
func TestSameAnswerOnEveryPath(t *testing.T) {
	c := newAllInOne(t)
	clt := adminClient(t, c.dataDir, c.p)
	ctx := context.Background()
	now := time.Now().UTC()

	// Two records named "dup": the older one points at a dead port, the
	// newer one at the real node's SSH port.
	deadAddr := freeport.RefusedAddr(t)
	older := services.Node{UUID: "00000000-0000-4000-8000-000000000001", Hostname: "dup", Addr: deadAddr,
		Cluster: clusterName, LastHeartbeat: now.Add(-time.Minute), Expires: now.Add(10 * time.Minute)}
	newer := services.Node{UUID: "00000000-0000-4000-8000-000000000002", Hostname: "dup", Addr: c.p.Addr(service.ListenerNode).String(),
		Cluster: clusterName, LastHeartbeat: now, Expires: now.Add(10 * time.Minute), Labels: map[string]string{"env": "it"}}
	require.NoError(t, clt.UpsertNode(ctx, older))
	require.NoError(t, clt.UpsertNode(ctx, newer))
	waitNodes(t, clt, 3)
	// The proxy's NodeWatcher sees them through its watch.
	require.Eventually(t, func() bool {
		return strings.Contains(c.viaSubsystem(t, "dup:0").err, "ambiguous")
	}, 10*time.Second, 50*time.Millisecond)

	check := func(t *testing.T, target string, wantBanner bool, wantErr ...string) {
		t.Helper()
		sub := c.viaSubsystem(t, target)
		dt := c.viaDirectTCPIP(t, hostPortForDirect(target))
		out, errOut, err := pctl(t, c.dataDir, "", "route", target)
		if wantBanner {
			require.Equal(t, "SSH-2.0-", sub.banner, "subsystem: %+v", sub)
			require.Equal(t, "SSH-2.0-", dt.banner, "direct-tcpip: %+v", dt)
			require.NoError(t, err, "pctl route: %s %s", out, errOut)
			return
		}
		require.Error(t, err, "pctl route should fail: %s", out)
		for _, w := range wantErr {
			require.Contains(t, sub.err, w, "subsystem")
			require.Contains(t, unquote(dt.err), w, "direct-tcpip")
			require.Contains(t, out, w, "pctl route")
		}
	}

	t.Run("unique hostname", func(t *testing.T) { check(t, "node-1:0", true) })
	t.Run("not found", func(t *testing.T) { check(t, "ghost:0", false, `node "ghost" not found in cluster "it"`) })
	t.Run("ambiguous lists every candidate", func(t *testing.T) {
		check(t, "dup:0", false, `ambiguous host "dup" matches 2 nodes in cluster "it"; connect by UUID instead:`, older.UUID, newer.UUID)
	})
	t.Run("uuid picks one", func(t *testing.T) { check(t, newer.UUID+":0", true) })

	// most_recent: a change of the live config applies to the next dial.
	mustPctl(t, c.dataDir, "", "set", "networking", "--routing-strategy", "most_recent")
	require.Eventually(t, func() bool { return c.viaSubsystem(t, "dup:0").banner != "" }, 10*time.Second, 50*time.Millisecond)
	t.Run("most_recent picks the latest heartbeat", func(t *testing.T) {
		check(t, "dup:0", true)
		out := mustPctl(t, c.dataDir, "", "route", "dup")
		require.Contains(t, out, "chosen:     "+newer.UUID)
	})
}

// hostPortForDirect turns a subsystem target into a direct-tcpip HOST:PORT.
func hostPortForDirect(target string) string {
	if _, _, err := net.SplitHostPort(target); err == nil {
		return target
	}
	return target + ":0"
}

// unquote undoes the %q x/crypto applies to channel rejection messages.
func unquote(s string) string {
	var out string
	if i := strings.Index(s, "(\""); i >= 0 {
		if _, err := fmt.Sscanf(s[i+1:], "%q", &out); err == nil {
			return out
		}
	}
	return s
}
