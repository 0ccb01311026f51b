package srv

import (
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// benchEnv starts a node for a benchmark.
func benchEnv(b *testing.B) *testEnv {
	b.Helper()
	return newTestEnvTB(b)
}

// aesFirst mirrors what the proxy does as a client: AES-GCM has AES-NI
// assembly, chacha20-poly1305 in x/crypto does not (NOTES.md).
func aesFirst(cfg *ssh.ClientConfig) *ssh.ClientConfig {
	cfg.Ciphers = []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com"}
	return cfg
}

// BenchmarkSessionThroughput: bytes a session's stdout carries to the
// client, in one long-running session (`cat /dev/zero`), so that session
// set-up does not count.
func BenchmarkSessionThroughput(b *testing.B) {
	e := benchEnv(b)
	benchSessionThroughput(b, e.addr, aesFirst(e.clientConfig(e.me, e.signer(e.me))))
}

// BenchmarkLocalForwardThroughput: bytes through one direct-tcpip channel
// (ssh -L) to a sink on loopback.
func BenchmarkLocalForwardThroughput(b *testing.B) {
	e := benchEnv(b)
	benchForwardThroughput(b, e.addr, aesFirst(e.clientConfig(e.me, e.signer(e.me))))
}

const benchChunk = 1 << 20

func benchSessionThroughput(b *testing.B, addr string, cfg *ssh.ClientConfig) {
	c, err := ssh.Dial("tcp", addr, cfg)
	require.NoError(b, err)
	defer c.Close()
	s, err := c.NewSession()
	require.NoError(b, err)
	defer s.Close()
	out, err := s.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, s.Start("exec cat /dev/zero"))
	// Warm up: the first bytes include process start.
	_, err = io.CopyN(io.Discard, out, benchChunk)
	require.NoError(b, err)
	b.SetBytes(benchChunk)
	b.ResetTimer()
	n, err := io.CopyN(io.Discard, out, int64(b.N)*benchChunk)
	b.StopTimer()
	require.NoError(b, err)
	require.EqualValues(b, int64(b.N)*benchChunk, n)
}

func benchForwardThroughput(b *testing.B, addr string, cfg *ssh.ClientConfig) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	var sunk int64
	go func() {
		defer wg.Done()
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		sunk, _ = io.Copy(io.Discard, conn)
		conn.Close()
	}()
	c, err := ssh.Dial("tcp", addr, cfg)
	require.NoError(b, err)
	defer c.Close()
	conn, err := c.Dial("tcp", ln.Addr().String())
	require.NoError(b, err)
	buf := make([]byte, benchChunk)
	b.SetBytes(benchChunk)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, err := conn.Write(buf)
		require.NoError(b, err)
	}
	require.NoError(b, conn.Close())
	wg.Wait()
	b.StopTimer()
	require.EqualValues(b, int64(b.N)*benchChunk, sunk)
}

// BenchmarkIdleSessionMemory reports heap+stack per idle session (a shell
// waiting on `cat` with no pty), measured in this process, which holds
// both the node and the x/crypto client: the server's share is lower.
func BenchmarkIdleSessionMemory(b *testing.B) {
	e := benchEnv(b)
	const n = 100
	for i := 0; i < b.N; i++ {
		c, err := ssh.Dial("tcp", e.addr, e.clientConfig(e.me, e.signer(e.me)))
		require.NoError(b, err)
		before := memInUse()
		g0 := runtime.NumGoroutine()
		var sessions []*ssh.Session
		for j := 0; j < n; j++ {
			s, err := c.NewSession()
			require.NoError(b, err)
			stdin, err := s.StdinPipe()
			require.NoError(b, err)
			out, err := s.StdoutPipe()
			require.NoError(b, err)
			require.NoError(b, s.Start("echo up; exec cat"))
			line := make([]byte, 3)
			_, err = io.ReadFull(out, line)
			require.NoError(b, err)
			_ = stdin
			sessions = append(sessions, s)
		}
		after := memInUse()
		b.ReportMetric(float64(after-before)/n, "B/session")
		b.ReportMetric(float64(runtime.NumGoroutine()-g0)/n, "goroutines/session")
		for _, s := range sessions {
			s.Close()
		}
		c.Close()
		// Let the server finish this connection before the next round.
		require.Eventually(b, func() bool {
			e.srv.mu.Lock()
			defer e.srv.mu.Unlock()
			return len(e.srv.conns) == 0
		}, 30*time.Second, 10*time.Millisecond)
	}
}

func memInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
