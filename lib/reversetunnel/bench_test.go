package reversetunnel

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// Environment of the agents' helper process (TestBenchAgentsHelper).
const (
	envBenchAgents  = "POSTERN_BENCH_AGENTS"
	envBenchAddr    = "POSTERN_BENCH_ADDR"
	envBenchProxyCA = "POSTERN_BENCH_PROXY_CA"
)

// TestBenchAgentsHelper is not a test: BenchmarkIdleTunnels re-runs the
// test binary with it to hold the agents in a process of their own, so
// that the benchmark's heap and CPU are the proxy's alone. It prints its
// CA's public key, runs the agents, and exits when stdin closes.
func TestBenchAgentsHelper(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(envBenchAgents))
	if n == 0 {
		t.Skip("helper process of BenchmarkIdleTunnels")
	}
	proxyCA, _, _, _, err := ssh.ParseAuthorizedKey([]byte(os.Getenv(envBenchProxyCA)))
	require.NoError(t, err)
	ca := srvtest.NewCA(t)
	fmt.Printf("CA %s\n", ca.AuthorizedKey())
	in := bufio.NewReader(os.Stdin)
	_, _ = in.ReadString('\n') // the proxy trusts the CA now
	var agents []*Agent
	for i := range n {
		a, err := NewAgent(AgentConfig{
			ProxyAddr: os.Getenv(envBenchAddr),
			Signer:    ca.RoleHostSigner(t, srvtest.HostCert{UUID: fmt.Sprintf("node-%d", i), Role: RoleNode}),
			HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{proxyCA} },
			Handler:   func(nc net.Conn) { _, _ = io.Copy(nc, nc); nc.Close() },
		})
		require.NoError(t, err)
		a.Start()
		agents = append(agents, a)
	}
	_, _ = io.Copy(io.Discard, in)
	for _, a := range agents {
		_ = a.Close()
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memInUse is the live heap and the goroutine stacks, after a GC.
func memInUse() (heap, stacks uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.StackInuse
}

// BenchmarkIdleTunnels holds 1,000 tunnels (100 with -short) on one
// tunnel server, with real SSH over loopback from agents in a helper
// process, and reports the server's heap, goroutine stacks and goroutines
// per tunnel and
// its CPU per idle tunnel over one keep-alive interval (keep-alives are
// all an idle tunnel costs). Run with -benchtime=1x: each iteration sets
// up every tunnel from scratch.
func BenchmarkIdleTunnels(b *testing.B) {
	n := 1000
	if testing.Short() {
		n = 100
	}
	idle := DefaultKeepAliveInterval
	for range b.N {
		benchIdleTunnels(b, n, idle)
	}
}

func benchIdleTunnels(b *testing.B, n int, idle time.Duration) {
	b.StopTimer()
	ca := srvtest.NewCA(b)
	var agentCA atomic.Pointer[ssh.PublicKey]
	s, err := NewServer(ServerConfig{
		HostSigner: ca.RoleHostSigner(b, srvtest.HostCert{UUID: "proxy-1", Role: RoleProxy, Principals: []string{"127.0.0.1"}}),
		HostCAs: func() []ssh.PublicKey {
			if k := agentCA.Load(); k != nil {
				return []ssh.PublicKey{*k}
			}
			return nil
		},
	})
	require.NoError(b, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = s.Serve(ln) }()
	defer s.Close()
	heapBefore, stackBefore := memInUse()
	goBefore := runtime.NumGoroutine()

	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchAgentsHelper$")
	cmd.Env = append(os.Environ(), envBenchAgents+"="+strconv.Itoa(n), envBenchAddr+"="+ln.Addr().String(),
		envBenchProxyCA+"="+strings.TrimSpace(ca.AuthorizedKey()))
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	cmd.Stderr = io.Discard
	require.NoError(b, cmd.Start())
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(b, err)
	k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(strings.TrimPrefix(line, "CA ")))
	require.NoError(b, err)
	agentCA.Store(&k)
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	b.StartTimer()
	start := time.Now()
	_, err = io.WriteString(stdin, "go\n")
	require.NoError(b, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for testutil.ToFloat64(s.tunnels) < float64(n) {
		select {
		case <-ctx.Done():
			b.Fatalf("only %v of %d tunnels came up", testutil.ToFloat64(s.tunnels), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	setup := time.Since(start)
	b.StopTimer()
	heapAfter, stackAfter := memInUse()
	goAfter := runtime.NumGoroutine()
	cpu0 := cpuTime()
	time.Sleep(idle) // the measured window itself: nothing to wait for
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(n), "tunnels")
	b.ReportMetric(float64(heapAfter-heapBefore)/float64(n)/1024, "heap-KiB/tunnel")
	b.ReportMetric(float64(stackAfter-stackBefore)/float64(n)/1024, "stack-KiB/tunnel")
	b.ReportMetric(float64(goAfter-goBefore)/float64(n), "goroutines/tunnel")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n)/idle.Seconds(), "cpu-µs/idle-tunnel/s")
	b.ReportMetric(setup.Seconds()*1000/float64(n), "setup-ms/tunnel")
}
