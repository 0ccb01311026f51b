package integration

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/service"
)

// TestAuditEvents: what happens through a cluster is in its audit log,
// both in DATA_DIR/log/events.log and searchable with `pctl events ls`,
// with session ids that tie a session's start and end together.
func TestAuditEvents(t *testing.T) {
	c := newAllInOne(t)
	clt, err := c.viaJump(t, c.hostname+":0")
	require.NoError(t, err)
	out, err := run(t, clt, "echo audited")
	require.NoError(t, err)
	require.Equal(t, "audited\n", out)
	_, err = c.viaJump(t, "ghost:0")
	require.Error(t, err)

	var found []events.Event
	require.Eventually(t, func() bool {
		stdout, _, err := pctl(t, c.dataDir, "", "events", "ls", "--format", "json")
		if err != nil {
			return false
		}
		found = found[:0]
		for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
			var e events.Event
			if json.Unmarshal([]byte(line), &e) == nil {
				found = append(found, e)
			}
		}
		return countType(found, events.SessionEnd) > 0
	}, 20*time.Second, 100*time.Millisecond)

	var start, end *events.Event
	for i := range found {
		e := &found[i]
		if e.Type == events.SessionStart && e.Fields[events.FieldCommand] == "echo audited" {
			start = e
		}
	}
	require.NotNil(t, start, "session.start in %v", found)
	for i := range found {
		e := &found[i]
		if e.Type == events.SessionEnd && e.Fields[events.FieldSessionID] == start.Fields[events.FieldSessionID] {
			end = e
		}
	}
	require.NotNil(t, end, "session.end for %v", start.Fields[events.FieldSessionID])
	require.Equal(t, "alice", start.User)
	require.Equal(t, clusterName, start.Cluster)
	require.Equal(t, json.Number("8"), end.Fields[events.FieldBytesOut], "numbers come back as json.Number")

	text := mustPctl(t, c.dataDir, "", "events", "ls", "--type", events.SessionStart)
	require.Contains(t, text, "session.start")
	require.NotContains(t, text, "session.end")

	data, err := os.ReadFile(filepath.Join(c.dataDir, "log", "events.log"))
	require.NoError(t, err)
	require.Contains(t, string(data), `"event":"session.start"`)
}

func countType(es []events.Event, typ string) int {
	n := 0
	for _, e := range es {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// eventsLs runs the real `pctl events ls --format json` against dataDir.
func eventsLs(t *testing.T, dataDir string) []events.Event {
	t.Helper()
	stdout, _, err := pctl(t, dataDir, "", "events", "ls", "--format", "json")
	if err != nil {
		return nil
	}
	var found []events.Event
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var e events.Event
		if json.Unmarshal([]byte(line), &e) == nil {
			found = append(found, e)
		}
	}
	return found
}

// TestJoinedNodeEventsReachAuth: a node-only process, joined with a real
// token and left with the default cluster name in its config, ships its
// events to auth: a session on it is in `pctl events ls` under the real
// cluster name, with the node's UUID vouched for by auth, and the join
// itself is audited.
func TestJoinedNodeEventsReachAuth(t *testing.T) {
	c := newAllInOne(t)
	out := mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "node")
	m := joinRe.FindStringSubmatch(out)
	require.NotNil(t, m, "join command in %q", out)

	dir2 := t.TempDir()
	cfg := procConfig(dir2, config.RoleNode)
	cfg.ClusterName = "" // what `postern start --roles node --token ...` has
	cfg.AuthServer, cfg.Token, cfg.CAPin, cfg.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], "joined"
	b := startProcess(t, cfg)
	waitNodes(t, adminClient(t, c.dataDir, c.p), 2)

	clt, err := c.viaJump(t, "joined:0")
	require.NoError(t, err)
	got, err := run(t, clt, "echo shipped")
	require.NoError(t, err)
	require.Equal(t, "shipped\n", got)
	require.NoError(t, clt.Close())

	var start, end, join *events.Event
	require.Eventually(t, func() bool {
		found := eventsLs(t, c.dataDir)
		start, end, join = nil, nil, nil
		for i := range found {
			e := &found[i]
			switch {
			case e.Type == events.SessionStart && e.Fields[events.FieldCommand] == "echo shipped":
				start = e
			case e.Type == events.HostJoin && e.Fields[events.FieldServerID] == b.HostUUID():
				join = e
			}
		}
		if start == nil {
			return false
		}
		for i := range found {
			if e := &found[i]; e.Type == events.SessionEnd && e.Fields[events.FieldSessionID] == start.Fields[events.FieldSessionID] {
				end = e
			}
		}
		return end != nil && join != nil
	}, 20*time.Second, 100*time.Millisecond, "session.start, session.end and host.join of the joined node in pctl events ls")
	require.Equal(t, clusterName, start.Cluster, "the real cluster name, not the config default")
	require.Equal(t, clusterName, end.Cluster)
	require.Equal(t, b.HostUUID(), start.Fields[events.FieldServerID])
	require.Equal(t, b.HostUUID(), start.Fields[events.FieldEmitterID], "auth recorded who shipped it")
	require.Equal(t, "node", start.Fields[events.FieldEmitterRole])
	require.Equal(t, "alice", start.User)
	require.Equal(t, "node", join.Fields[events.FieldRole])
	require.Equal(t, "joined", join.Fields[events.FieldHostname])

	// The node's own events.log is written too, with the right name.
	data, err := os.ReadFile(filepath.Join(dir2, "log", "events.log"))
	require.NoError(t, err)
	require.Contains(t, string(data), `"event":"session.start"`)
	require.Contains(t, string(data), `"cluster":"`+clusterName+`"`)
	require.NotContains(t, string(data), `"cluster":"`+config.DefaultClusterName+`"`)
}

// TestConnectionRefusalsAudited: connections refused at the per-address
// cap, before any handshake, are in `pctl events ls` (once per address
// and minute, with a count), not only in the process log.
func TestConnectionRefusalsAudited(t *testing.T) {
	c := newAllInOneWith(t, func(cfg *config.Config) { cfg.Limits.MaxConnectionsPerIP = 2 })
	addr := c.p.Addr(service.ListenerProxySSH).String()
	var held []net.Conn
	t.Cleanup(func() {
		for _, conn := range held {
			conn.Close()
		}
	})
	for range 2 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		held = append(held, conn)
	}
	for range 3 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		line, _ := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		require.Contains(t, line, "too many connections from 127.0.0.1")
	}

	var refused []events.Event
	require.Eventually(t, func() bool {
		refused = refused[:0]
		for _, e := range eventsLs(t, c.dataDir) {
			if e.Type == events.ConnRefused {
				refused = append(refused, e)
			}
		}
		return len(refused) > 0
	}, 20*time.Second, 100*time.Millisecond)
	require.Len(t, refused, 1, "one event per address and minute, not one per connection: %v", refused)
	e := refused[0]
	require.Equal(t, service.ListenerProxySSH, e.Fields[events.FieldListener])
	require.Equal(t, "ip", e.Fields[events.FieldCap])
	require.Contains(t, e.Fields[events.FieldReason], "too many connections from 127.0.0.1: limit 2")
	require.Contains(t, e.Fields[events.FieldRemoteAddr], "127.0.0.1:")
	require.Equal(t, clusterName, e.Cluster)
}
