package client

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// testProxy is a real x/crypto SSH server on 127.0.0.1:0 that hands every
// channel to handle; done is closed when the test ends, so that handlers
// that never answer can return.
type testProxy struct {
	done chan struct{}
	wg   sync.WaitGroup
}

// startTestProxy returns a client connected to a server running handle.
func startTestProxy(t *testing.T, handle func(p *testProxy, nch ssh.NewChannel)) *ssh.Client {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	hostKey, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(hostKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &testProxy{done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		_, chans, reqs, err := ssh.NewServerConn(nc, cfg)
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			ssh.DiscardRequests(reqs)
		}()
		for nch := range chans {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				handle(p, nch)
			}()
		}
	}()
	clt, err := ssh.Dial("tcp", ln.Addr().String(), &ssh.ClientConfig{
		User: "alice",
		// The host key is not what these tests are about (HostCAChecker
		// has its own).
		HostKeyCallback: ssh.FixedHostKey(hostKey.PublicKey()),
		Timeout:         10 * time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		clt.Close()
		ln.Close()
		close(p.done)
		p.wg.Wait()
	})
	return clt
}

// within fails the test when f does not return within a generous bound:
// the bound only turns a hang into a failure, nothing waits for it.
func within[T any](t *testing.T, f func() T) T {
	t.Helper()
	res := make(chan T, 1)
	go func() { res <- f() }()
	select {
	case v := <-res:
		return v
	case <-time.After(20 * time.Second):
		t.Fatal("did not return")
		panic("unreachable")
	}
}

// TestOpenSubsystemHonoursCtx: a proxy that never answers the channel
// open, or never answers the subsystem request, does not hold psh once
// its context ends.
func TestOpenSubsystemHonoursCtx(t *testing.T) {
	for _, tc := range []struct {
		name   string
		handle func(p *testProxy, nch ssh.NewChannel, seen chan<- struct{})
	}{
		{"channel open never answered", func(p *testProxy, nch ssh.NewChannel, seen chan<- struct{}) {
			close(seen)
			<-p.done
		}},
		{"subsystem request never answered", func(p *testProxy, nch ssh.NewChannel, seen chan<- struct{}) {
			ch, reqs, err := nch.Accept()
			if err != nil {
				return
			}
			defer ch.Close()
			<-reqs // the subsystem request: held, never answered
			close(seen)
			<-p.done
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan struct{})
			clt := startTestProxy(t, func(p *testProxy, nch ssh.NewChannel) { tc.handle(p, nch, seen) })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				<-seen
				cancel()
			}()
			err := within(t, func() error {
				_, err := OpenSubsystem(ctx, clt, SubsystemConfig{Name: "proxy:web:22"})
				return err
			})
			require.True(t, trace.IsConnectionProblem(err), "%v", err)
			require.ErrorIs(t, err, context.Canceled)
		})
	}

	t.Run("ctx already done", func(t *testing.T) {
		opened := make(chan struct{}, 2)
		clt := startTestProxy(t, func(p *testProxy, nch ssh.NewChannel) {
			opened <- struct{}{}
			_ = nch.Reject(ssh.Prohibited, "unexpected")
		})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := OpenSubsystem(ctx, clt, SubsystemConfig{Name: "nodes"})
		require.ErrorIs(t, err, context.Canceled)
		// Nothing was opened, and the proxy connection was left alone: a
		// probe channel reaches the proxy (which rejects it), and it is
		// the only channel that did.
		_, _, err = clt.OpenChannel("session", nil)
		var open *ssh.OpenChannelError
		require.ErrorAs(t, err, &open)
		<-opened
		require.Empty(t, opened, "only the probe channel reached the proxy")
	})
}

// TestSubsystemWaitsUseTheClock: Explain and ExitStatus wait for the
// proxy's stderr and exit-status on the injected clock, so a proxy that
// keeps the channel open is waited for exactly stderrWait of clock time.
func TestSubsystemWaitsUseTheClock(t *testing.T) {
	t.Run("refused, stderr left open", func(t *testing.T) {
		clt := startTestProxy(t, func(p *testProxy, nch ssh.NewChannel) {
			ch, reqs, err := nch.Accept()
			if err != nil {
				return
			}
			defer ch.Close()
			req := <-reqs
			_, _ = ch.Stderr().Write([]byte("postern: node \"web\" not found\r\n"))
			_ = req.Reply(false, nil)
			<-p.done
		})
		clock := clockwork.NewFakeClock()
		tee := &signalWriter{want: "not found", seen: make(chan struct{})}
		errc := make(chan error, 1)
		go func() {
			_, err := OpenSubsystem(context.Background(), clt, SubsystemConfig{Name: "proxy:web:22", Deps: observe.Deps{Clock: clock}, Tee: tee})
			errc <- err
		}()
		<-tee.seen
		// psh closes its side of a refused channel, and x/crypto answers a
		// close with a close, so stderr may end before Explain waits at
		// all: advance the clock only if something waits on it. (The
		// subtest below is the one that proves the waits use the clock.)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		waiting := make(chan error, 1)
		go func() { waiting <- clock.BlockUntilContext(ctx, 1) }()
		var err error
		select {
		case err = <-errc:
			cancel()
			<-waiting
		case werr := <-waiting:
			require.NoError(t, werr, "psh neither returned nor waited on the injected clock")
			clock.Advance(stderrWait)
			err = <-errc
		}
		require.True(t, trace.IsBadParameter(err), "%v", err)
		require.Equal(t, `node "web" not found`, err.Error())
	})

	t.Run("accepted, channel left open", func(t *testing.T) {
		clt := startTestProxy(t, func(p *testProxy, nch ssh.NewChannel) {
			ch, reqs, err := nch.Accept()
			if err != nil {
				return
			}
			defer ch.Close()
			req := <-reqs
			_ = req.Reply(true, nil)
			// Wanting a reply orders it: psh has recorded the status
			// before the stderr line below reaches it.
			_, _ = ch.SendRequest("exit-status", true, ssh.Marshal(struct{ Status uint32 }{3}))
			_, _ = ch.Stderr().Write([]byte("postern: still here\r\n"))
			<-p.done
		})
		clock := clockwork.NewFakeClock()
		tee := &signalWriter{want: "still here", seen: make(chan struct{})}
		sub, err := OpenSubsystem(context.Background(), clt, SubsystemConfig{Name: "nodes", Deps: observe.Deps{Clock: clock}, Tee: tee})
		require.NoError(t, err)
		defer sub.Close()
		<-tee.seen // captured: Explain's wait is only for the end of the stream

		got := make(chan string, 1)
		go func() { got <- sub.Explain() }()
		advanceWhenWaiting(t, clock)
		require.Equal(t, "still here", <-got)

		st := make(chan int, 1)
		go func() { st <- sub.ExitStatus() }()
		advanceWhenWaiting(t, clock)
		require.Equal(t, 3, <-st)
	})
}

// advanceWhenWaiting waits until one timer is set on clock and moves the
// clock past stderrWait.
func advanceWhenWaiting(t *testing.T, clock *clockwork.FakeClock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "nothing waited on the injected clock")
	clock.Advance(stderrWait)
}

// signalWriter closes seen once what it was written contains want.
type signalWriter struct {
	mu   sync.Mutex
	buf  []byte
	want string
	seen chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := strings.Contains(string(w.buf), w.want)
	w.buf = append(w.buf, p...)
	if !had && strings.Contains(string(w.buf), w.want) {
		close(w.seen)
	}
	return len(p), nil
}
