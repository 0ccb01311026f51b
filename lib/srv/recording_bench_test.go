package srv

import (
	"context"
	"flag"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// recBenchRounds is how many off/on pairs BenchmarkRecordingThroughput
// runs; more rounds give a spread of ratios on a shared machine.
var recBenchRounds = flag.Int("recbench.rounds", 1, "BenchmarkRecordingThroughput: off/on pairs to run, interleaved")

// BenchmarkRecordingThroughput: a pty session's output (`yes` printing a
// line of terminal text, the shape of a busy build log) through the node
// to an SSH client, with recording off and on, the arms alternating
// (off, on, off, on, ...; -recbench.rounds pairs) so that both see the
// same machine (target: on >= 0.9x off). Each pair's on/off throughput
// ratio is logged, and their min, median and max at the end.
// cpu-ms/MB is this process's CPU (node and client both) per MB through
// the session; the difference between the arms is recording's cost per
// recorded MB. reads/MB (read system calls) and ctxsw/MB (context
// switches) show whether recording changes how the copy runs: smaller
// pty reads, or extra wakeups from handing batches over. The recorder is the node's own: the spool sink, its
// segment files and fsyncs.
//
//	go test -run '^$' -bench RecordingThroughput -benchtime 64x ./lib/srv/ -recbench.rounds 5
func BenchmarkRecordingThroughput(b *testing.B) {
	var ratios []float64
	for round := 0; round < *recBenchRounds; round++ {
		var rate [2]float64
		for i, arm := range []string{"off", "on"} {
			b.Run("recording="+arm, func(b *testing.B) { rate[i] = recordingThroughputArm(b, arm == "on") })
		}
		if rate[0] > 0 && rate[1] > 0 {
			ratios = append(ratios, rate[1]/rate[0])
			b.Logf("round %d: on/off throughput %.2f", round+1, rate[1]/rate[0])
		}
	}
	if len(ratios) > 1 {
		sort.Float64s(ratios)
		b.Logf("on/off throughput over %d rounds: min %.2f, median %.2f, max %.2f", len(ratios), ratios[0], ratios[len(ratios)/2], ratios[len(ratios)-1])
	}
}

// recordingThroughputArm runs one arm and returns its throughput in
// bytes per second.
func recordingThroughputArm(b *testing.B, record bool) float64 {
	spool := recording.DirStorage{Dir: b.TempDir()}
	e := newTestEnvTB(b, func(c *Config) {
		if !record {
			return
		}
		r, err := NewRecorder(RecorderConfig{Spool: spool, Settings: func(context.Context) (*services.ClusterNetworkingConfig, error) {
			// No cap: every byte is recorded however long it runs.
			cfg := &services.ClusterNetworkingConfig{Spec: services.ClusterNetworkingConfigSpec{MaxRecordingBytes: 1 << 40}}
			return cfg, cfg.CheckAndSetDefaults()
		}})
		require.NoError(b, err)
		c.Recorder = r
	})
	c, err := ssh.Dial("tcp", e.addr, aesFirst(e.clientConfig(e.me, e.signer(e.me))))
	require.NoError(b, err)
	defer c.Close()
	s, err := c.NewSession()
	require.NoError(b, err)
	defer s.Close()
	require.NoError(b, s.RequestPty("xterm", 50, 200, ssh.TerminalModes{}))
	out, err := s.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, s.Start(`exec yes "  CC      lib/recording/writer.o -O2 -Wall -fstack-protector-strong [ok]"`))
	_, err = io.CopyN(io.Discard, out, benchChunk)
	require.NoError(b, err)
	cpu0, r0, cs0 := cpuTime(), readSyscalls(), contextSwitches()
	b.SetBytes(benchChunk)
	b.ResetTimer()
	start := time.Now()
	n, err := io.CopyN(io.Discard, out, int64(b.N)*benchChunk)
	elapsed := time.Since(start)
	b.StopTimer()
	require.NoError(b, err)
	mb := float64(n) / (1 << 20)
	b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/mb, "cpu-ms/MB")
	b.ReportMetric(float64(readSyscalls()-r0)/mb, "reads/MB")
	b.ReportMetric(float64(contextSwitches()-cs0)/mb, "ctxsw/MB")
	return float64(n) / elapsed.Seconds()
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// contextSwitches is this process's context switches so far, voluntary
// (a thread blocking: an idle runtime thread parking, a read waiting)
// and involuntary (preempted): more per MB with recording on would mean
// that handing batches to the store goroutine costs wakeups.
func contextSwitches() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Nvcsw + ru.Nivcsw
}

// readSyscalls is this process's read system calls so far (the pty's,
// the node's and the client's sockets'): more per MB means smaller reads.
func readSyscalls() int64 {
	data, _ := os.ReadFile("/proc/self/io")
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "syscr: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
