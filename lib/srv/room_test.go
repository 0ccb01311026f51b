package srv

import (
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/srv/party"
)

// subscriberText reads s until want shows up (or the subscription ends)
// and returns everything read.
func subscriberText(t *testing.T, s *party.Subscriber, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var b strings.Builder
	for !strings.Contains(b.String(), want) {
		p, err := s.Next(ctx)
		require.NoError(t, err, "waiting for %q in %q", want, b.String())
		b.Write(p)
	}
	return b.String()
}

// TestPTYSessionIsARoom: a pty session is in the node's registry under
// the id its shell reads in SSH_SESSION_ID; a subscriber sees its output
// live, input through the gate reaches its program, and it leaves the
// registry (its subscribers reading the end) when it ends.
func TestPTYSessionIsARoom(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	require.NoError(t, s.Shell())
	_, err = io.WriteString(stdin, "echo id$((1+1))=$SSH_SESSION_ID.\n")
	require.NoError(t, err)
	idRE := regexp.MustCompile(`id2=([0-9a-f-]{36})\.`)
	require.Eventually(t, func() bool { return idRE.MatchString(w.String()) }, 10*time.Second, 5*time.Millisecond)
	id := idRE.FindStringSubmatch(w.String())[1]

	room, err := e.srv.parties.Get(id)
	require.NoError(t, err)
	require.Equal(t, "alice", room.User)
	require.Equal(t, e.me, room.Login)
	sub, err := room.Out.Subscribe()
	require.NoError(t, err)
	defer sub.Close()
	// The joiner's first read is the screen as it is.
	subscriberText(t, sub, "id2="+id)

	_, err = io.WriteString(stdin, "echo from-owner-$((6*7))\n")
	require.NoError(t, err)
	subscriberText(t, sub, "from-owner-42")
	_, err = room.In.Write([]byte("echo from-peer-$((7*7))\n"))
	require.NoError(t, err)
	w.waitFor(t, "from-peer-49")
	subscriberText(t, sub, "from-peer-49")

	_, err = io.WriteString(stdin, "exit\n")
	require.NoError(t, err)
	require.NoError(t, s.Wait())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, err := sub.Next(ctx); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	_, err = e.srv.parties.Get(id)
	require.True(t, isNotFound(err), "%v", err)
}

// TestExecIsNotARoom: a command without a pty has no screen to share and
// is never joinable.
func TestExecIsNotARoom(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	require.NoError(t, s.Start("echo started; sleep 30"))
	w.waitFor(t, "started")
	require.Empty(t, e.srv.parties.List())
}

func isNotFound(err error) bool { return trace.IsNotFound(err) }
