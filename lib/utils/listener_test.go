package utils

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
)

// scriptedListener is a net.Listener whose Accept results the test hands
// over one at a time, announcing each call on calls.
type scriptedListener struct {
	calls   chan struct{}
	results chan acceptResult
	closed  chan struct{}
	once    sync.Once
}

type acceptResult struct {
	conn net.Conn
	err  error
}

func newScriptedListener() *scriptedListener {
	return &scriptedListener{
		calls:   make(chan struct{}, 64),
		results: make(chan acceptResult),
		closed:  make(chan struct{}),
	}
}

func (s *scriptedListener) Accept() (net.Conn, error) {
	s.calls <- struct{}{}
	select {
	case r := <-s.results:
		return r.conn, r.err
	case <-s.closed:
		return nil, net.ErrClosed
	}
}

func (s *scriptedListener) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

func (s *scriptedListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// recv receives from ch, failing the test instead of hanging when nothing
// comes before ctx ends.
func recv[T any](t *testing.T, ctx context.Context, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// send sends v on ch, failing the test instead of hanging.
func send[T any](t *testing.T, ctx context.Context, ch chan<- T, v T, what string) {
	t.Helper()
	select {
	case ch <- v:
	case <-ctx.Done():
		t.Fatalf("timed out handing over %s", what)
	}
}

func emfile() error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

type streakEvent struct {
	active bool
	err    error
}

func newTestRetrying(t *testing.T, ln net.Listener, clock clockwork.Clock) (*RetryingListener, *test.Hook, chan streakEvent) {
	logger, hook := test.NewNullLogger()
	streaks := make(chan streakEvent, 8)
	rl := NewRetryingListener(ln, RetryConfig{
		Name:     "test",
		Deps:     observe.Deps{Clock: clock, Logger: logger},
		OnStreak: func(active bool, err error) { streaks <- streakEvent{active, err} },
	})
	return rl, hook, streaks
}

func countLevel(hook *test.Hook, level logrus.Level) int {
	n := 0
	for _, e := range hook.AllEntries() {
		if e.Level == level {
			n++
		}
	}
	return n
}

// TestRetryingListenerBackoff checks the pause sequence (5ms doubling to
// 1s), one Warn and one OnStreak per streak, and the health report.
func TestRetryingListenerBackoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := clockwork.NewFakeClock()
	sl := newScriptedListener()
	rl, hook, streaks := newTestRetrying(t, sl, clock)
	defer rl.Close()

	type res struct {
		c   net.Conn
		err error
	}
	out := make(chan res, 1)
	go func() {
		c, err := rl.Accept()
		out <- res{c, err}
	}()

	recv(t, ctx, sl.calls, "an Accept call")
	send(t, ctx, sl.results, acceptResult{err: emfile()}, "an accept result")
	ev := recv(t, ctx, streaks, "a streak report")
	require.True(t, ev.active)
	require.ErrorIs(t, ev.err, syscall.EMFILE)
	require.ErrorContains(t, rl.Healthy(), "test: accept is out of file descriptors")

	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000}
	for i, ms := range want {
		pause := ms * time.Millisecond
		require.NoError(t, clock.BlockUntilContext(ctx, 1))
		clock.Advance(pause - time.Nanosecond)
		select {
		case <-sl.calls:
			t.Fatalf("retry %d came before its %v pause", i, pause)
		default:
		}
		clock.Advance(time.Nanosecond)
		recv(t, ctx, sl.calls, "an Accept call")
		if i < len(want)-1 {
			err := emfile()
			if i%2 == 1 {
				// ENFILE (the machine is out) is treated the same.
				err = &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.ENFILE)}
			}
			send(t, ctx, sl.results, acceptResult{err: err}, "an accept result")
		}
	}
	require.Equal(t, 1, countLevel(hook, logrus.WarnLevel), "one Warn per streak")
	require.Empty(t, streaks, "one OnStreak per streak")

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	send(t, ctx, sl.results, acceptResult{conn: a}, "an accept result")
	r := recv(t, ctx, out, "Accept to return")
	require.NoError(t, r.err)
	require.Equal(t, a, r.c)
	ev = recv(t, ctx, streaks, "a streak report")
	require.False(t, ev.active)
	require.NoError(t, rl.Healthy())
	require.Equal(t, 1, countLevel(hook, logrus.InfoLevel))

	// The next streak starts at the floor again, and logs again.
	go func() {
		c, err := rl.Accept()
		out <- res{c, err}
	}()
	recv(t, ctx, sl.calls, "an Accept call")
	send(t, ctx, sl.results, acceptResult{err: emfile()}, "an accept result")
	require.True(t, recv(t, ctx, streaks, "a streak report").active)
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(AcceptRetryFloor)
	recv(t, ctx, sl.calls, "an Accept call")
	require.Equal(t, 2, countLevel(hook, logrus.WarnLevel))

	// Close interrupts: Accept returns the closed listener's error.
	require.NoError(t, rl.Close())
	r = recv(t, ctx, out, "Accept to return")
	require.ErrorIs(t, r.err, net.ErrClosed)
	require.NoError(t, rl.Healthy())
}

// TestRetryingListenerOtherErrors: anything but a descriptor shortage ends
// Accept at once, without a streak.
func TestRetryingListenerOtherErrors(t *testing.T) {
	sl := newScriptedListener()
	rl, hook, streaks := newTestRetrying(t, sl, clockwork.NewFakeClock())
	defer rl.Close()
	boom := errors.New("boom")
	go func() { sl.results <- acceptResult{err: boom} }()
	_, err := rl.Accept()
	require.ErrorIs(t, err, boom)
	require.Empty(t, streaks)
	require.Empty(t, hook.AllEntries())
	require.False(t, OutOfDescriptors(boom))
	require.True(t, OutOfDescriptors(fmt.Errorf("wrapped: %w", syscall.ENFILE)))
}

const emfileChildEnv = "POSTERN_TEST_EMFILE_CHILD"

// TestRetryingListenerEMFILE exhausts descriptors for real: it re-runs
// this test binary with a low RLIMIT_NOFILE (set in the child, so the test
// process itself is never starved), and the child checks that Accept backs
// off while no descriptor is free and serves the waiting connection once
// they are freed.
func TestRetryingListenerEMFILE(t *testing.T) {
	if os.Getenv(emfileChildEnv) == "1" {
		emfileChild(t)
		return
	}
	if testing.Short() {
		t.Skip("runs a subprocess")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRetryingListenerEMFILE$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), emfileChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child output:\n%s", out)
	require.Contains(t, string(out), "EMFILE child: ok", "child output:\n%s", out)
}

func openFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(entries)
}

func emfileChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var rlim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rlim))
	limit := uint64(openFDs(t) + 32)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: limit, Max: rlim.Max}))
	t.Logf("RLIMIT_NOFILE soft limit %d", limit)

	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	rl, hook, streaks := newTestRetrying(t, raw, clock)
	defer rl.Close()

	// Take every descriptor left.
	var hogs []*os.File
	freeHogs := func() {
		for _, f := range hogs {
			f.Close()
		}
		hogs = nil
	}
	defer freeHogs()
	for {
		f, err := os.Open("/dev/null")
		if err != nil {
			require.ErrorIs(t, err, syscall.EMFILE)
			break
		}
		hogs = append(hogs, f)
		require.Less(t, len(hogs), 10000, "the rlimit did not apply")
	}
	// Give one back for the client socket: the kernel completes the
	// client's handshake from the listener's backlog, and only the
	// server's accept needs a descriptor it cannot get.
	var client net.Conn
	for client == nil {
		require.NotEmpty(t, hogs)
		hogs[len(hogs)-1].Close()
		hogs = hogs[:len(hogs)-1]
		client, err = net.Dial("tcp", raw.Addr().String())
		if err != nil {
			require.True(t, OutOfDescriptors(err), "%v", err)
			client = nil
		}
	}
	defer client.Close()

	type res struct {
		c   net.Conn
		err error
	}
	out := make(chan res, 1)
	go func() {
		c, err := rl.Accept()
		out <- res{c, err}
	}()
	var ev streakEvent
	select {
	case ev = <-streaks:
	case r := <-out:
		t.Fatalf("Accept did not meet a descriptor shortage: %v %v", r.c, r.err)
	case <-ctx.Done():
		t.Fatal("no descriptor shortage streak was reported")
	}
	require.True(t, ev.active)
	require.True(t, OutOfDescriptors(ev.err), "%v", ev.err)
	require.Error(t, rl.Healthy())

	// A retry while still out of descriptors keeps backing off.
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(AcceptRetryFloor)
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	select {
	case r := <-out:
		t.Fatalf("Accept returned while out of descriptors: %v %v", r.c, r.err)
	default:
	}
	require.Equal(t, 1, countLevel(hook, logrus.WarnLevel))

	// Free the descriptors: the waiting connection is accepted.
	freeHogs()
	clock.Advance(2 * AcceptRetryFloor)
	r := recv(t, ctx, out, "Accept to return")
	require.NoError(t, r.err)
	defer r.c.Close()
	require.False(t, recv(t, ctx, streaks, "a streak report").active)
	require.NoError(t, rl.Healthy())

	_, err = client.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(r.c, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))

	// And the listener goes on serving.
	c2, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer c2.Close()
	s2, err := rl.Accept()
	require.NoError(t, err)
	s2.Close()
	fmt.Println("EMFILE child: ok (descriptors " + strconv.FormatUint(limit, 10) + ")")
}
