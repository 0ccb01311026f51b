package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/events"
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
