package srv

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// rawClient connects with x/crypto but handles global requests itself.
func (e *testEnv) rawClient(t *testing.T, onRequest func(*ssh.Request)) (ssh.Conn, chan struct{}) {
	nc, err := net.Dial("tcp", e.addr)
	require.NoError(t, err)
	sc, chans, reqs, err := ssh.NewClientConn(nc, e.addr, e.clientConfig(e.me, e.signer(e.me)))
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		for nch := range chans {
			_ = nch.Reject(ssh.Prohibited, "no")
		}
	}()
	go func() {
		defer close(done)
		for r := range reqs {
			onRequest(r)
		}
	}()
	t.Cleanup(func() { sc.Close(); <-done })
	return sc, done
}

func TestKeepAliveClosesDeadClient(t *testing.T) {
	clock := clockwork.NewFakeClock()
	e := newTestEnv(t, func(c *Config) {
		c.Clock = clock
		c.KeepAliveInterval = time.Minute
		c.KeepAliveCountMax = 3
	})
	got := make(chan *ssh.Request, 8)
	// A client that never answers.
	_, done := e.rawClient(t, func(r *ssh.Request) { got <- r })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(time.Minute)
	r := <-got
	require.Equal(t, keepAliveRequest, r.Type)
	require.True(t, r.WantReply)
	for i := 0; i < 3; i++ {
		require.NoError(t, clock.BlockUntilContext(ctx, 1))
		clock.Advance(time.Minute)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("connection not closed after unanswered keep-alives")
	}
	e.requireLog("Connection ended.", "no answer to 3 keep-alives")
}

func TestKeepAliveKeepsLiveClient(t *testing.T) {
	clock := clockwork.NewFakeClock()
	e := newTestEnv(t, func(c *Config) {
		c.Clock = clock
		c.KeepAliveInterval = time.Minute
	})
	answered := make(chan struct{}, 8)
	sc, done := e.rawClient(t, func(r *ssh.Request) {
		_ = r.Reply(false, nil) // "unknown request" is an answer too
		answered <- struct{}{}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := e.onlyConn(t)
	// Six intervals: twice what closes a silent client.
	for i := 1; i <= 6; i++ {
		require.NoError(t, clock.BlockUntilContext(ctx, 1))
		clock.Advance(time.Minute)
		<-answered
		require.Eventually(t, func() bool { return conn.keepAlivesAnswered.Load() == int64(i) }, 5*time.Second, time.Millisecond)
	}
	select {
	case <-done:
		t.Fatal("a live client was disconnected")
	default:
	}
	// Still usable.
	ok, _, err := sc.SendRequest("ping@example", true, nil)
	require.NoError(t, err)
	require.False(t, ok)
}

func TestIdleTimeout(t *testing.T) {
	clock := clockwork.NewFakeClock()
	e := newTestEnv(t, func(c *Config) {
		c.Clock = clock
		c.KeepAliveInterval = -1
		c.IdleTimeout = 10 * time.Minute
	})
	c, err := e.dialAs(e.me, e.signer(e.me))
	require.NoError(t, err)
	defer c.Close()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	require.NoError(t, s.Start("cat"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(6 * time.Minute)
	_, err = stdin.Write([]byte("ping\n"))
	require.NoError(t, err)
	w.waitFor(t, "ping") // channel data at t=6m resets the idle clock
	clock.Advance(4 * time.Minute)
	// At t=10m the timer fires, sees activity 4m ago and re-arms for 6m.
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	closed := make(chan error, 1)
	go func() { closed <- c.Wait() }()
	select {
	case <-closed:
		t.Fatal("closed while active")
	default:
	}
	clock.Advance(6 * time.Minute)
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("idle connection not closed")
	}
	e.requireLog("Connection ended.", "idle timeout: no channel data for 10m0s")
}

func TestGracefulShutdown(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	stdin, err := s.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	require.NoError(t, s.Start("echo ready; read x; echo bye $x"))
	w.waitFor(t, "ready")

	shut := make(chan error, 1)
	go func() { shut <- e.srv.Shutdown(context.Background()) }()
	// New connections are refused once the listener is closed.
	require.Eventually(t, func() bool {
		_, err := e.dialAs(e.me, e.signer(e.me))
		return err != nil
	}, 5*time.Second, 10*time.Millisecond)
	select {
	case <-shut:
		t.Fatal("Shutdown returned while a session was running")
	default:
	}
	// The running session finishes normally.
	_, err = stdin.Write([]byte("now\n"))
	require.NoError(t, err)
	require.NoError(t, s.Wait())
	require.Contains(t, w.waitFor(t, "bye now"), "bye now")
	require.NoError(t, c.Close())
	require.NoError(t, <-shut)
}

func TestShutdownForcesAfterDeadline(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	var stderr bytes.Buffer // read after Wait, which waits for the copy
	s.Stderr = &stderr
	stdout, err := s.StdoutPipe()
	require.NoError(t, err)
	w := watchOutput(stdout)
	require.NoError(t, s.Start("echo started; sleep 60"))
	w.waitFor(t, "started")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no grace at all
	require.ErrorIs(t, e.srv.Shutdown(ctx), context.Canceled)
	// The client sees its connection end, and reads why on stderr.
	require.Error(t, s.Wait())
	require.Contains(t, stderr.String(), MsgShuttingDown)
}

// onlyConn returns the server's single connection.
func (e *testEnv) onlyConn(t *testing.T) *conn {
	var c *conn
	require.Eventually(t, func() bool {
		e.srv.mu.Lock()
		defer e.srv.mu.Unlock()
		for cc := range e.srv.conns {
			c = cc
		}
		return len(e.srv.conns) == 1
	}, 5*time.Second, time.Millisecond)
	return c
}
