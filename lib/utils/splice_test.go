package utils

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s := <-accepted
	require.NotNil(t, s)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

type spliceResult struct {
	aToB, bToA int64
	err        error
}

// startSplice splices two TCP connections: clientA <-> [a | b] <-> clientB.
func startSplice(t *testing.T, ctx context.Context) (clientA, clientB *net.TCPConn, res chan spliceResult) {
	clientA, a := tcpPair(t)
	b, clientB := tcpPair(t)
	res = make(chan spliceResult, 1)
	go func() {
		x, y, err := Splice(ctx, a, b)
		res <- spliceResult{x, y, err}
	}()
	return clientA, clientB, res
}

func TestSpliceHalfClose(t *testing.T) {
	clientA, clientB, res := startSplice(t, context.Background())

	_, err := clientA.Write([]byte("abc"))
	require.NoError(t, err)
	require.NoError(t, clientA.CloseWrite())

	// B reads to EOF: the half-close crossed the splice.
	got, err := io.ReadAll(clientB)
	require.NoError(t, err)
	require.Equal(t, "abc", string(got))

	// The other direction still flows after A's EOF.
	_, err = clientB.Write([]byte("done"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(clientA, buf)
	require.NoError(t, err)
	require.Equal(t, "done", string(buf))
	require.NoError(t, clientB.CloseWrite())

	r := <-res
	require.NoError(t, r.err)
	require.EqualValues(t, 3, r.aToB)
	require.EqualValues(t, 4, r.bToA)

	// Splice closed both of its sides: A now sees EOF.
	rest, err := io.ReadAll(clientA)
	require.NoError(t, err)
	require.Empty(t, rest)
}

func TestSpliceLargeBothWays(t *testing.T) {
	clientA, clientB, res := startSplice(t, context.Background())
	up := make([]byte, 3<<20+17)
	down := make([]byte, 2<<20+5)
	_, _ = rand.Read(up)
	_, _ = rand.Read(down)

	gotB := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(clientB)
		gotB <- b
	}()
	gotA := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(clientA)
		gotA <- b
	}()
	go func() {
		_, _ = clientB.Write(down)
		_ = clientB.CloseWrite()
	}()
	_, err := clientA.Write(up)
	require.NoError(t, err)
	require.NoError(t, clientA.CloseWrite())

	require.True(t, bytes.Equal(up, <-gotB))
	require.True(t, bytes.Equal(down, <-gotA))
	r := <-res
	require.NoError(t, r.err)
	require.EqualValues(t, len(up), r.aToB)
	require.EqualValues(t, len(down), r.bToA)
}

func TestSpliceContextCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	clientA, _, res := startSplice(t, ctx)
	_, err := clientA.Write([]byte("x"))
	require.NoError(t, err)
	cancel()
	r := <-res
	require.ErrorIs(t, r.err, context.Canceled)
}

// TestSpliceResetClosesBoth: when one side disappears abruptly, the
// other side is closed too instead of waiting forever.
func TestSpliceResetClosesBoth(t *testing.T) {
	clientA, clientB, res := startSplice(t, context.Background())
	require.NoError(t, clientA.SetLinger(0))
	require.NoError(t, clientA.Close()) // RST
	// B sees its side closed once Splice gives up.
	_, err := io.ReadAll(clientB)
	require.NoError(t, err)
	<-res
}

// noHalfClose is a ReadWriteCloser without CloseWrite (a pipe end).
type noHalfClose struct {
	io.Reader
	io.WriteCloser
}

func (n noHalfClose) Close() error { return n.WriteCloser.Close() }

// TestSpliceWithoutCloseWrite: a destination that cannot half-close is
// closed at EOF so that its reader learns the stream ended.
func TestSpliceWithoutCloseWrite(t *testing.T) {
	clientA, a := tcpPair(t)
	pr, pw := io.Pipe()   // what Splice writes into (b's write side)
	inR, inW := io.Pipe() // what Splice reads from (b's read side)
	b := noHalfClose{inR, pw}
	res := make(chan spliceResult, 1)
	go func() {
		x, y, err := Splice(context.Background(), a, b)
		res <- spliceResult{x, y, err}
	}()
	_, err := clientA.Write([]byte("hello"))
	require.NoError(t, err)
	require.NoError(t, clientA.CloseWrite())
	got, err := io.ReadAll(pr)
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))
	require.NoError(t, inW.Close())
	r := <-res
	require.NoError(t, r.err)
	require.EqualValues(t, 5, r.aToB)
}

func BenchmarkSpliceTCP(b *testing.B) {
	pair := benchPairs(b)
	clientA, a := pair()
	bb, clientB := pair()
	done := make(chan struct{})
	go func() {
		_, _, _ = Splice(context.Background(), a.(*net.TCPConn), bb.(*net.TCPConn))
		close(done)
	}()
	go func() { _, _ = io.Copy(io.Discard, clientB) }()
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := clientA.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	clientA.Close()
	clientB.Close()
	<-done
}

// BenchmarkSpliceIdle reports the heap one idle splice holds (two TCP
// pairs spliced, nothing flowing): what a proxy pays per held connection.
// A few bytes pass first, so the buffers have been touched as in real use.
func BenchmarkSpliceIdle(b *testing.B) {
	const n = 200
	pair := benchPairs(b)
	for i := 0; i < b.N; i++ {
		var clients []net.Conn
		var before, after runtime.MemStats
		// Twice: sync.Pool keeps the previous iteration's buffers through
		// one collection (its victim cache), which would hide them from
		// this iteration's count.
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&before)
		var wg sync.WaitGroup
		for j := 0; j < n; j++ {
			ca, a := pair()
			bb, cb := pair()
			clients = append(clients, ca, cb)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _, _ = Splice(context.Background(), a, bb)
			}()
			if _, err := ca.Write([]byte("ping")); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(cb, make([]byte, 4)); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/splice")
		for _, c := range clients {
			c.Close()
		}
		wg.Wait()
	}
}

// benchPairs returns a maker of loopback TCP connection pairs for
// benchmarks; the listener closes with the benchmark.
func benchPairs(b *testing.B) func() (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	return func() (net.Conn, net.Conn) {
		ch := make(chan net.Conn, 1)
		go func() { c, _ := ln.Accept(); ch <- c }()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		return c, <-ch
	}
}

// TestSpliceQuietSocketDeliversEverything: writes of sizes around the idle
// and full buffers, each followed by silence (the connection stays open),
// arrive whole: a direction that goes quiet after a partial read must not
// wait for more data while some is still in the socket.
func TestSpliceQuietSocketDeliversEverything(t *testing.T) {
	clientA, clientB, res := startSplice(t, context.Background())
	for _, n := range []int{1, idleBufferSize - 1, idleBufferSize, idleBufferSize + 1, 3*idleBufferSize + 7,
		spliceBufferSize, spliceBufferSize + 1, 5*spliceBufferSize + 3} {
		msg := bytes.Repeat([]byte{byte(n)}, n)
		_, err := clientA.Write(msg)
		require.NoError(t, err)
		got := make([]byte, n)
		_, err = io.ReadFull(clientB, got)
		require.NoError(t, err, "size %d", n)
		require.Equal(t, msg, got, "size %d", n)
		// And the other way.
		_, err = clientB.Write(msg)
		require.NoError(t, err)
		_, err = io.ReadFull(clientA, got)
		require.NoError(t, err, "size %d back", n)
		require.Equal(t, msg, got, "size %d back", n)
	}
	clientA.Close()
	clientB.Close()
	<-res
}

// TestSpliceQuietSocketHasNoGoroutine: n splices of a non-socket stream
// (net.Pipe, as an SSH channel is) with a TCP socket, all quiet, cost one
// goroutine each (the caller's, blocked reading the pipe) plus the one
// poller goroutine, not two each: the quiet socket direction is parked in
// the poller. Data in both directions still flows, and the splices end on
// close, leaving no goroutine (goleak in TestMain).
func TestSpliceQuietSocketHasNoGoroutine(t *testing.T) {
	// slack: the poller's goroutine and Eventually's own (the condition
	// runs in one); without parking the count would be 2n.
	const n, slack = 20, 4
	type pair struct {
		pipe   net.Conn // the far end of the pipe
		client *net.TCPConn
	}
	pairs := make([]pair, n)
	var wg sync.WaitGroup
	before := runtime.NumGoroutine()
	for i := range pairs {
		pipeFar, pipeNear := net.Pipe()
		client, sock := tcpPair(t)
		pairs[i] = pair{pipe: pipeFar, client: client}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _ = Splice(context.Background(), pipeNear, sock)
		}()
	}
	// Every splice quiet: its socket direction parks, and leaves its
	// goroutine.
	waitParked(t, n)
	if !assert.Eventually(t, func() bool { return runtime.NumGoroutine()-before <= n+slack }, 5*time.Second, 10*time.Millisecond) {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines for %d quiet splices: %d\n%s", n, runtime.NumGoroutine()-before, buf[:runtime.Stack(buf, true)])
	}
	t.Logf("goroutines for %d quiet splices: %d", n, runtime.NumGoroutine()-before)
	for _, p := range pairs {
		// Socket to pipe: the parked direction wakes up.
		_, err := p.client.Write([]byte("ping"))
		require.NoError(t, err)
		got := make([]byte, 4)
		_, err = io.ReadFull(p.pipe, got)
		require.NoError(t, err)
		require.Equal(t, "ping", string(got))
		// Pipe to socket.
		_, err = p.pipe.Write([]byte("pong"))
		require.NoError(t, err)
		_, err = io.ReadFull(p.client, got)
		require.NoError(t, err)
		require.Equal(t, "pong", string(got))
	}
	// Quiet again, then ended: from the socket side for half of them
	// (an EOF wakes the parked direction), and for the rest by a
	// half-close from the pipe side, which leaves the parked direction
	// open until the socket's peer answers with its own close.
	waitParked(t, n)
	require.Eventually(t, func() bool { return runtime.NumGoroutine()-before <= n+slack }, 5*time.Second, 10*time.Millisecond)
	for i, p := range pairs {
		if i%2 == 0 {
			p.client.Close()
			continue
		}
		p.pipe.Close()
		_, err := p.client.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "the pipe's close reaches the socket as a half-close")
		p.client.Close()
	}
	wg.Wait()
}

// waitParked awaits n parked splice directions (WaitParkedSplices).
func waitParked(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, WaitParkedSplices(ctx, n), "%d quiet splice directions did not all park", n)
}

// TestCloseSplicedEndsParkedDirection: a quiet splice of a pipe (an SSH
// channel stand-in) with a socket whose peer stays silent and open (a
// stopped process), whose socket is then closed from outside the splice
// with CloseSpliced: the splice ends and closes the pipe, though no event
// ever comes from the socket. Repeated, since the close races the parking.
func TestCloseSplicedEndsParkedDirection(t *testing.T) {
	for range 20 {
		pipeFar, pipeNear := net.Pipe()
		_, sock := tcpPair(t)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _, _ = Splice(context.Background(), pipeNear, sock)
		}()
		waitParked(t, 1)
		require.NoError(t, CloseSpliced(sock))
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("a splice parked on a socket closed with CloseSpliced did not end")
		}
		_ = pipeFar.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.Copy(io.Discard, pipeFar)
		require.NoError(t, err, "the pipe was closed")
	}
}
