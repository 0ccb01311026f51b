package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/lib/utils"
)

// helperEnv, when set to a credentials directory, turns the test binary
// into the client helper of BenchmarkIdleMemory.
const helperEnv = "POSTERN_BENCH_CLIENT_HELPER"

// idleConns is how many idle sessions BenchmarkIdleMemory holds per path.
var idleConns = envInt("POSTERN_BENCH_IDLE_CONNS", 50)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkIdleMemory is the server-side heap of an idle session: a helper
// process (this binary re-executed, so the clients' memory is not counted)
// opens idleConns sessions running `exec cat` on the node, directly and
// through the proxy, and the benchmark compares the Go heap in use (after
// a GC) before and while they are open. Reported per connection: node
// (direct), jump (proxy + node, as ssh -J), and proxy = jump - node; the
// same for goroutines. POSTERN_BENCH_IDLE_CONNS changes the count (default
// 50, as bench/postern-vs-openssh.sh).
func BenchmarkIdleMemory(b *testing.B) {
	c := getCluster(b)
	dir := b.TempDir()
	if err := writeCreds(dir, c.creds()); err != nil {
		b.Fatal(err)
	}
	var node, jump, nodeG, jumpG, nodeS, jumpS float64
	for i := 0; i < b.N; i++ {
		h, g, s, err := idleCost(dir, "", c.node)
		if err != nil {
			b.Fatal(err)
		}
		node += h
		nodeG += g
		nodeS += s
		h, g, s, err = idleCost(dir, c.proxy, c.node)
		if err != nil {
			b.Fatal(err)
		}
		jump += h
		jumpG += g
		jumpS += s
	}
	n := float64(b.N)
	b.ReportMetric(node/n, "node-heapB/conn")
	b.ReportMetric(jump/n, "jump-heapB/conn")
	b.ReportMetric((jump-node)/n, "proxy-heapB/conn")
	b.ReportMetric(nodeG/n, "node-goroutines/conn")
	b.ReportMetric((jumpG-nodeG)/n, "proxy-goroutines/conn")
	// Goroutine stacks are not heap: heap + stacks is what an idle
	// session costs the process (before the runtime's own overheads).
	b.ReportMetric((jumpS-nodeS)/n, "proxy-stackB/conn")
	b.ReportMetric((jump-node+jumpS-nodeS)/n, "proxy-heap+stackB/conn")
}

// heapInUse is the live heap after two GCs (the second one frees what
// finalizers released in the first).
func heapInUse() (heap uint64, goroutines int, stack uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, runtime.NumGoroutine(), ms.StackInuse
}

// idleCost opens idleConns idle sessions from the helper and returns the
// heap and goroutine growth per session.
func idleCost(dir, proxyAddr, nodeAddr string) (heapPerConn, goroutinesPerConn, stackPerConn float64, err error) {
	h0, g0, s0 := heapInUse()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir,
		"POSTERN_BENCH_PROXY="+proxyAddr, "POSTERN_BENCH_NODE="+nodeAddr,
		"POSTERN_BENCH_IDLE_CONNS="+strconv.Itoa(idleConns))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, 0, 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, 0, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, 0, 0, err
	}
	defer func() {
		stdin.Close()
		if werr := cmd.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("client helper: %v", werr)
		}
		// Let the servers notice the closed connections before the next
		// measurement (and before goleak looks).
		waitGoroutines(g0, 10*time.Second)
	}()
	line, rerr := bufio.NewReader(stdout).ReadString('\n')
	if rerr != nil || line != "ready\n" {
		return 0, 0, 0, fmt.Errorf("client helper did not get ready: %q %v", line, rerr)
	}
	// An idle splice direction leaves its goroutine only after
	// utils.SpliceParkAfter without data: count what an idle session
	// settles at, not one still in its linger. Through the proxy, each
	// session's node-socket direction parks (the channel direction has
	// no socket); a platform without the poller parks none, and the
	// count is taken at once.
	if proxyAddr != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		perr := utils.WaitParkedSplices(ctx, idleConns)
		cancel()
		if perr != nil {
			return 0, 0, 0, fmt.Errorf("%d idle sessions did not all park their node-socket direction: %v", idleConns, perr)
		}
	}
	h1, g1, s1 := heapInUse()
	if path := os.Getenv("POSTERN_BENCH_HEAPPROFILE"); path != "" && proxyAddr != "" {
		if err := writeHeapProfile(path); err != nil {
			return 0, 0, 0, err
		}
	}
	n := float64(idleConns)
	return (float64(h1) - float64(h0)) / n, float64(g1-g0) / n, (float64(s1) - float64(s0)) / n, nil
}

// writeHeapProfile saves the in-use heap while the idle sessions are open
// (POSTERN_BENCH_HEAPPROFILE=FILE; `go tool pprof -sample_index=inuse_space`).
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}

func waitGoroutines(want int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for runtime.NumGoroutine() > want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // polling a count: there is no event to wait on
	}
}

// runClientHelper holds idle sessions until stdin closes.
func runClientHelper() int {
	cr, err := readCreds(os.Getenv(helperEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	proxyAddr, nodeAddr := os.Getenv("POSTERN_BENCH_PROXY"), os.Getenv("POSTERN_BENCH_NODE")
	n := envInt("POSTERN_BENCH_IDLE_CONNS", 50)
	hops := make([]*hop, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8) // a few handshakes at a time: 2 cores
	for i := range hops {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// The proxy admits 20 new connections per second from one
			// address after a burst of 250: sessions come from 127.0.0.2
			// up to .201, at most a few each.
			h, err := dialNodeFrom(cr, proxyAddr, nodeAddr, nil, net.IPv4(127, 0, 0, byte(2+i%200)))
			if err != nil {
				errs[i] = err
				return
			}
			hops[i] = h
			s, err := h.node.NewSession()
			if err != nil {
				errs[i] = err
				return
			}
			// stdin stays open and idle: cat waits on it until the
			// connection ends.
			if _, err := s.StdinPipe(); err != nil {
				errs[i] = err
				return
			}
			errs[i] = s.Start("exec cat")
		}()
	}
	wg.Wait()
	code := 0
	for _, err := range errs {
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			code = 1
			break
		}
	}
	if code == 0 {
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
	}
	for _, h := range hops {
		if h != nil {
			h.Close()
		}
	}
	return code
}
