package recording

import (
	"bytes"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/stretchr/testify/require"
)

// BenchmarkWriter: the writer alone (asciicast encoding, gzip, the hash
// chain, the spool's segment files with their fsync) on terminal-like
// output in 32 KiB reads, as a pty copy delivers it. cpu-ms/MB is the
// process's CPU (the caller's copy and the store goroutine's encoding,
// gzip, hashing and file writes) per recorded MB; ns/op is wall time, in
// which the store goroutine overlaps the caller on a second core.
func BenchmarkWriter(b *testing.B) {
	line := []byte("\x1b[32m  CC\x1b[0m      lib/recording/writer.o -O2 -Wall -fstack-protector-strong [ok]\r\n")
	read := bytes.Repeat(line, (32<<10)/len(line))
	w, err := New(Config{
		Header:   Header{SessionID: testSession, Width: 200, Height: 50},
		Sink:     &SpoolSink{Storage: DirStorage{Dir: b.TempDir()}, Session: testSession},
		Deps:     observe.Deps{Clock: clockwork.NewFakeClock()},
		MaxBytes: 1 << 40,
	})
	require.NoError(b, err)
	b.SetBytes(int64(len(read)))
	cpu0 := cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.Output(read)
	}
	_, err = w.Close("exit-status 0")
	b.StopTimer()
	require.NoError(b, err)
	mb := float64(b.N*len(read)) / (1 << 20)
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/mb, "cpu-ms/MB")
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
