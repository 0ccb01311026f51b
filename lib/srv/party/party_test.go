package party

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// readAll drains s until io.EOF.
func readAll(t *testing.T, s *Subscriber) []byte {
	t.Helper()
	var out []byte
	for {
		p, err := s.Next(context.Background())
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out = append(out, p...)
	}
}

// TestSlowSubscriberNeverBlocks: a subscriber that never reads does not
// hold the writer nor another subscriber; it is caught up with the
// current screen, after a notice, when it reads at last.
func TestSlowSubscriberNeverBlocks(t *testing.T) {
	var primary bytes.Buffer
	clock := clockwork.NewFakeClock()
	b := NewBroadcaster(Config{Primary: &primary, Cols: 40, Rows: 5, QueueBytes: 4 << 10, Clock: clock, Frame: -1})
	slow, err := b.Subscribe()
	require.NoError(t, err)
	fast, err := b.Subscribe()
	require.NoError(t, err)
	got := make(chan []byte)
	go func() {
		var out []byte
		for {
			p, err := fast.Next(context.Background())
			if err != nil {
				got <- out
				return
			}
			out = append(out, p...)
			// The fast one drops nothing: it reads as fast as it can, and
			// the writer waits for it below.
		}
	}()
	var want bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			line := fmt.Sprintf("line %04d\r\n", i)
			want.WriteString(line)
			_, err := b.Write([]byte(line))
			require.NoError(t, err)
			if i%50 == 0 {
				// Let the fast reader keep up (it has a 4 KiB queue).
				waitFor(t, func() bool { return fast.queuedBytes() == 0 })
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the writer was blocked by a subscriber that does not read")
	}
	require.Equal(t, want.String(), primary.String())
	_, err = slow.Next(context.Background()) // its first screen
	require.NoError(t, err)
	got2 := make(chan []byte, 1)
	go func() {
		p, err := slow.Next(context.Background())
		require.NoError(t, err)
		got2 <- p
	}()
	// The catch-up waits for the lag pause to end.
	require.NoError(t, clock.BlockUntilContext(context.Background(), 1))
	select {
	case p := <-got2:
		t.Fatalf("caught up before the pause ended: %q", p)
	default:
	}
	clock.Advance(DefaultLagPause)
	p := <-got2
	require.True(t, strings.HasPrefix(string(p), LaggedNotice), "%q", p)
	require.True(t, strings.HasSuffix(string(p), "line 1999\r\n"), "the tail of the output")
	require.NotContains(t, string(p), "line 0000")
	require.LessOrEqual(t, len(p), len(LaggedNotice)+TailBytes)
	require.Positive(t, slow.Lags())
	b.Close()
	out := <-got
	require.Equal(t, 0, fast.Lags())
	require.True(t, bytes.HasSuffix(out, want.Bytes()[want.Len()-4000:]))
	// Every line reached the fast one, in order, after its first screen.
	require.Contains(t, string(out), "line 0001\r\nline 0002\r\n")
	require.Contains(t, string(out), "line 1998\r\nline 1999\r\n")
	slow.Close()
}

func (s *Subscriber) queuedBytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond)
}

// TestManySubscribers: each of many concurrent readers gets the whole
// stream, in order, after the screen at its join.
func TestManySubscribers(t *testing.T) {
	b := NewBroadcaster(Config{QueueBytes: 1 << 20})
	const n = 50
	var wg sync.WaitGroup
	outs := make([][]byte, n)
	for i := 0; i < n; i++ {
		s, err := b.Subscribe()
		require.NoError(t, err)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			outs[i] = readAll(t, s)
		}(i)
	}
	var want bytes.Buffer
	for i := 0; i < 500; i++ {
		line := fmt.Sprintf("%d\r\n", i)
		want.WriteString(line)
		_, _ = b.Write([]byte(line))
	}
	b.Close()
	wg.Wait()
	for i, out := range outs {
		require.True(t, bytes.HasSuffix(out, want.Bytes()), "subscriber %d", i)
	}
}

// TestJoinCatchUp: a subscriber that joins mid-session reads the screen
// as it is (not the history scrolled away), then what follows, once.
func TestJoinCatchUp(t *testing.T) {
	b := NewBroadcaster(Config{Cols: 20, Rows: 3})
	defer b.Close()
	for i := 0; i < 10; i++ {
		_, _ = b.Write([]byte(fmt.Sprintf("old %d\r\n", i)))
	}
	_, _ = b.Write([]byte("$ "))
	s, err := b.Subscribe()
	require.NoError(t, err)
	defer s.Close()
	_, _ = b.Write([]byte("after"))
	p, err := s.Next(context.Background())
	require.NoError(t, err)
	scr := string(p)
	require.Contains(t, scr, "old 9")
	require.NotContains(t, scr, "old 1\x1b", "scrolled away")
	require.True(t, strings.HasSuffix(scr, "after"), "%q", scr)
	require.Equal(t, 1, strings.Count(scr, "after"))
	b.Notice("bob joined\r\n")
	p, err = s.Next(context.Background())
	require.NoError(t, err)
	require.Equal(t, "bob joined\r\n", string(p))
}

// TestSubscribeAfterClose: an ended session cannot be joined.
func TestSubscribeAfterClose(t *testing.T) {
	b := NewBroadcaster(Config{})
	b.Close()
	_, err := b.Subscribe()
	require.Error(t, err)
	_, err = b.Write([]byte("x"))
	require.NoError(t, err)
}

// TestNextHonoursContext: a reader waiting for output leaves when its
// context ends.
func TestNextHonoursContext(t *testing.T) {
	b := NewBroadcaster(Config{})
	defer b.Close()
	s, err := b.Subscribe()
	require.NoError(t, err)
	_, err = s.Next(context.Background()) // the (empty) first screen
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.Next(ctx)
	require.ErrorIs(t, err, context.Canceled)
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestGate: input reaches the program only while the gate is open;
// what is typed while it is held or paused is dropped, not replayed.
func TestGate(t *testing.T) {
	var dst lockedBuf
	g := NewGate(&dst, Held)
	select {
	case <-g.Opened():
		t.Fatal("a held gate is not open")
	default:
	}
	_, _ = g.Write([]byte("rm -rf /\r"))
	g.Set(Open)
	<-g.Opened()
	_, _ = g.Write([]byte("ls\r"))
	g.Set(Paused)
	_, _ = g.Write([]byte("typed while paused"))
	g.Set(Open)
	_, _ = g.Write([]byte("pwd\r"))
	require.Equal(t, "ls\rpwd\r", dst.String())
	require.Equal(t, "open", g.State().String())
}

// TestRegistry: sessions are found by id, an unknown id is not found,
// and the listing names the parties.
func TestRegistry(t *testing.T) {
	r := NewRegistry()
	now := time.Now()
	s := &Session{ID: "a", User: "alice", Started: now}
	require.NoError(t, r.Add(s))
	require.Error(t, r.Add(&Session{ID: "a"}))
	require.NoError(t, r.Add(&Session{ID: "b", Started: now.Add(-time.Hour)}))
	got, err := r.Get("a")
	require.NoError(t, err)
	require.Same(t, s, got)
	_, err = r.Get("c")
	require.ErrorContains(t, err, "not found")
	require.Equal(t, "b", r.List()[0].ID)
	p := &Party{User: "bob", Mode: Moderator, Joined: now}
	s.AddParty(p)
	s.AddParty(&Party{User: "carol", Mode: Observer, Joined: now.Add(time.Second)})
	require.Equal(t, []string{"alice", "bob (moderator)", "carol (observer)"}, s.Info().Participants)
	require.Equal(t, 1, s.Count(Moderator))
	require.Equal(t, 0, s.RemoveParty(p))
	r.Remove("a")
	_, err = r.Get("a")
	require.Error(t, err)
}

// TestModeration: observers never count; a rule that terminates wins
// over one that pauses; Changed wakes at a join and a leave.
func TestModeration(t *testing.T) {
	isAuditor := func(roles []string, _ Mode) bool { return len(roles) > 0 && roles[0] == "auditor" }
	s := &Session{Require: []Requirement{{Count: 1, Counts: isAuditor}, {Count: 2, Terminate: true, Counts: isAuditor}}}
	require.Equal(t, Terminate, s.Moderation())
	ch := s.Changed()
	obs := &Party{User: "o", Roles: []string{"auditor"}, Mode: Observer}
	s.AddParty(obs)
	<-ch
	require.Equal(t, Terminate, s.Moderation(), "an observer does not count")
	m1 := &Party{User: "m1", Roles: []string{"auditor"}, Mode: Moderator}
	s.AddParty(m1)
	require.Equal(t, Terminate, s.Moderation())
	s.AddParty(&Party{User: "m2", Roles: []string{"auditor"}, Mode: Moderator})
	require.Equal(t, Met, s.Moderation())
	ch = s.Changed()
	s.RemoveParty(m1)
	<-ch
	require.Equal(t, Terminate, s.Moderation())
	p := &Session{Require: []Requirement{{Count: 1, Counts: isAuditor}}}
	require.Equal(t, Pause, p.Moderation())
	p.AddParty(&Party{User: "x", Roles: []string{"dev"}, Mode: Moderator})
	require.Equal(t, Pause, p.Moderation(), "the wrong role does not count")
}
