package srv

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// TestAuditTrail: a session's start and end share a session_id and carry
// the bytes moved; a forward reports its bytes; a refused certificate is an
// access.denied naming the reason.
func TestAuditTrail(t *testing.T) {
	rec := events.NewRecorder()
	e := newTestEnv(t, func(c *Config) { c.Audit = rec })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	s.Stdin = strings.NewReader("12345")
	out, err := s.Output("cat; echo -n done")
	require.NoError(t, err)
	require.Equal(t, "12345done", string(out))

	start, err := rec.Wait(ctx, events.SessionStart, nil)
	require.NoError(t, err)
	require.Equal(t, "alice", start.User)
	require.Equal(t, "cat; echo -n done", start.Fields[events.FieldCommand])
	require.Equal(t, e.me, start.Fields[events.FieldLogin])
	end, err := rec.Wait(ctx, events.SessionEnd, func(ev events.Event) bool {
		return ev.Fields[events.FieldSessionID] == start.Fields[events.FieldSessionID]
	})
	require.NoError(t, err)
	require.EqualValues(t, 5, end.Fields[events.FieldBytesIn])
	require.EqualValues(t, 9, end.Fields[events.FieldBytesOut])
	require.EqualValues(t, 0, end.Fields[events.FieldExitCode])

	target := echoServer(t)
	conn, err := c.Dial("tcp", target)
	require.NoError(t, err)
	echoRoundTrip(t, conn, "forward me")
	conn.Close()
	fwd, err := rec.Wait(ctx, events.PortForward, nil)
	require.NoError(t, err)
	require.Equal(t, target, fwd.Fields[events.FieldTarget])
	require.EqualValues(t, len("forward me"), fwd.Fields[events.FieldBytesIn])

	other := srvtest.NewCA(t)
	bad := other.UserSigner(t, srvtest.UserCert{User: "mallory", Logins: []string{e.me}, Cluster: testCluster, Now: time.Now()})
	_, err = ssh.Dial("tcp", e.addr, e.clientConfig(e.me, bad))
	require.Error(t, err)
	denied, err := rec.Wait(ctx, events.AccessDenied, nil)
	require.NoError(t, err)
	require.Equal(t, "mallory", denied.User)
	require.Contains(t, denied.Fields[events.FieldReason], "not signed by the user CA")
	_, _, err = net.SplitHostPort(denied.Fields[events.FieldRemoteAddr].(string))
	require.NoError(t, err)
}
