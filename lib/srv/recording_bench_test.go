package srv

import (
	"context"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/recording"
	"github.com/postern-dev/postern/lib/services"
)

// BenchmarkRecordingThroughput: a pty session's output (`yes` printing a
// line of terminal text, the shape of a busy build log) with recording on
// and off, side by side in one run (target: on >= 0.9x off). cpu-ms/MB is
// this process's CPU (node and client both) per MB through the session;
// the difference between the arms is recording's cost per recorded MB.
//
//	go test -run '^$' -bench RecordingThroughput -benchtime 64x ./lib/srv/
func BenchmarkRecordingThroughput(b *testing.B) {
	for _, arm := range []string{"off", "on"} {
		b.Run("recording="+arm, func(b *testing.B) {
			spool := recording.DirStorage{Dir: b.TempDir()}
			e := newTestEnvTB(b, func(c *Config) {
				if arm == "off" {
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
			cpu0 := cpuTime()
			b.SetBytes(benchChunk)
			b.ResetTimer()
			n, err := io.CopyN(io.Discard, out, int64(b.N)*benchChunk)
			b.StopTimer()
			require.NoError(b, err)
			mb := float64(n) / (1 << 20)
			b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/mb, "cpu-ms/MB")
		})
	}
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
