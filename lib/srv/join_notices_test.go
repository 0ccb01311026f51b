package srv

import (
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/srv/party"
)

// pausableReader is an owner's client that stops reading while paused:
// once the channel's window is used up, the node's writes to it block.
type pausableReader struct {
	r    io.Reader
	mu   sync.Mutex
	gate chan struct{}
}

func (p *pausableReader) Read(b []byte) (int, error) {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return p.r.Read(b)
}

func (p *pausableReader) pause() {
	p.mu.Lock()
	p.gate = make(chan struct{})
	p.mu.Unlock()
}

func (p *pausableReader) resume() {
	p.mu.Lock()
	close(p.gate)
	p.gate = nil
	p.mu.Unlock()
}

// TestJoinOwnerNotReading: an owner whose client stops reading holds its
// own session (its flow control), but never a join or a leave: joiners
// still get their first screen at once, and the owner reads the notices,
// in order, once it reads again; the joiner then sees the output live.
func TestJoinOwnerNotReading(t *testing.T) {
	e := newTestEnv(t)
	e.ap.UpsertRole(auditorRole("auditor", "observer", "peer"))
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	pr := &pausableReader{r: stdout}
	out := watchOutput(pr)
	require.NoError(t, s.Shell())
	_, err = io.WriteString(stdin, "echo id$((1+1))=$SSH_SESSION_ID.\n")
	require.NoError(t, err)
	idRE := regexp.MustCompile(`id2=([0-9a-f-]{36})\.`)
	require.Eventually(t, func() bool { return idRE.MatchString(out.String()) }, 10*time.Second, 5*time.Millisecond)
	id := idRE.FindStringSubmatch(out.String())[1]
	room, err := e.srv.parties.Get(id)
	require.NoError(t, err)

	// The owner stops reading and the shell floods: the node's writes
	// to the owner block once the client's window (2 MiB) is used up.
	pr.pause()
	before := room.Out.Written()
	_, err = io.WriteString(stdin, "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo flood-$((2+3))\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return room.Out.Written()-before >= 2<<20-64<<10 }, 15*time.Second, 5*time.Millisecond,
		"the owner's window is used up")

	obs, err := join(t, e, "olga", []string{"access", "auditor"}, party.JoinSubsystem(id, party.Observer))
	require.NoError(t, err)
	obs.out.waitFor(t, strings.Repeat("x", 40)) // the first screen, with the owner blocked
	peer, err := join(t, e, "pete", []string{"access", "auditor"}, party.JoinSubsystem(id, party.Peer))
	require.NoError(t, err)
	peer.out.waitFor(t, strings.Repeat("x", 40))
	obs.out.waitFor(t, "[postern: pete joined as peer]")
	require.NoError(t, peer.s.Close())
	obs.out.waitFor(t, "[postern: pete (peer) left]")
	require.NotContains(t, out.String(), "joined as", "the owner has not read yet")

	pr.resume()
	out.waitFor(t, "flood-5")
	got := out.waitFor(t, "[postern: pete (peer) left]")
	i, j, k := strings.Index(got, "[postern: olga joined as observer]"), strings.Index(got, "[postern: pete joined as peer]"), strings.Index(got, "[postern: pete (peer) left]")
	require.True(t, i >= 0 && i < j && j < k, "the owner reads the notices in order: %d %d %d", i, j, k)
	obs.out.waitFor(t, "flood-5")
	_, err = io.WriteString(stdin, "echo live-$((4+4))\n")
	require.NoError(t, err)
	obs.out.waitFor(t, "live-8")
}
