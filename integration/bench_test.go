package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/bench"
	"github.com/postern-dev/postern/lib/service"
)

// TestPshBenchSSH runs `psh bench ssh` against a real all-in-one: every
// scheduled session completes, the phases are each measured (> 0) and add
// up to the total (the means are additive: the phases partition each
// session's time from its scheduled start), the histogram is exported,
// and held sessions are sampled from the proxy's /metrics.
func TestPshBenchSSH(t *testing.T) {
	c := newAllInOne(t)
	e := newPshEnv(t, c)
	e.login(t, "alice", alicePassword+"\n")
	export := filepath.Join(t.TempDir(), "latency.hgrm")
	metrics := "http://" + c.p.Addr(service.ListenerDiag).String() + "/metrics"

	out := e.mustRun(t, "", "bench", "ssh", "--rate", "8", "--duration", "1s", "--phases", "--format", "json",
		"--export", export, "--hold", "3", "--metrics-url", metrics, c.login+"@"+c.hostname, "echo", "ok")
	var res bench.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	t.Logf("%s", out)
	require.EqualValues(t, 8, res.Scheduled)
	require.EqualValues(t, 8, res.Completed, "errors: %v", res.Errors)
	require.Zero(t, res.Failed)
	require.Positive(t, res.Latency.P50)
	require.LessOrEqual(t, res.Latency.P50, res.Latency.P99)
	require.LessOrEqual(t, res.Latency.P99, res.Latency.Max)

	want := []string{"queue", bench.PhaseTCP, bench.PhaseProxyKex, bench.PhaseProxyAuth, bench.PhaseRouteDial,
		bench.PhaseNodeKex, bench.PhaseNodeAuth, bench.PhaseChannelOpen, bench.PhaseFirstByte}
	var names []string
	var sum float64
	for _, p := range res.Phases {
		names = append(names, p.Name)
		require.EqualValues(t, 8, p.Count, p.Name)
		if p.Name != "queue" {
			// The queue is empty at 8/s; every real step takes time.
			require.Positive(t, p.Min, "phase %s", p.Name)
		}
		sum += p.Mean
	}
	require.Equal(t, want, names)
	require.InDelta(t, res.Latency.Mean, sum, 0.05*res.Latency.Mean+0.05, "phases add up to the total")

	hgrm, err := os.ReadFile(export)
	require.NoError(t, err)
	require.Contains(t, string(hgrm), "Percentile")
	require.Contains(t, string(hgrm), "#[Max")

	require.NotNil(t, res.Hold)
	require.Equal(t, 3, res.Hold.Sessions)
	require.Empty(t, res.Hold.SampleError)
	require.Positive(t, res.Hold.Before.RSS)
	require.Positive(t, res.Hold.After.Goroutines)
	require.Positive(t, res.Hold.GoroutinesPerSession, "held sessions hold goroutines at the proxy")

	t.Run("text", func(t *testing.T) {
		out := e.mustRun(t, "", "bench", "ssh", "--rate", "4", "--duration", "500ms", "--phases", c.login+"@"+c.hostname)
		require.Contains(t, out, "sessions: 2 scheduled")
		require.Contains(t, out, "p99.9")
		require.Contains(t, out, bench.PhaseRouteDial)
	})

	// --jump: the ssh -J path (direct-tcpip), phases and held sessions as
	// above; the proxy holds fewer goroutines per such session than per
	// proxy-subsystem session (no session channel of its own).
	t.Run("jump", func(t *testing.T) {
		out := e.mustRun(t, "", "bench", "ssh", "--jump", "--rate", "4", "--duration", "1s", "--phases", "--format", "json",
			"--hold", "3", "--metrics-url", metrics, c.login+"@"+c.hostname)
		var res bench.Result
		require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		require.EqualValues(t, 4, res.Completed, "errors: %v", res.Errors)
		for _, p := range res.Phases {
			if p.Name != "queue" {
				require.Positive(t, p.Min, "phase %s", p.Name)
			}
		}
		require.NotNil(t, res.Hold)
		require.Equal(t, 3, res.Hold.Sessions)
		require.Positive(t, res.Hold.GoroutinesPerSession)
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"rate zero", []string{"--rate", "0", c.hostname}, "--rate must be a positive number"},
			{"rate negative", []string{"--rate=-3", c.hostname}, "--rate must be a positive number"},
			{"duration zero", []string{"--duration", "0s", c.hostname}, "--duration must be positive"},
			{"bad source", []string{"--source", "nope", c.hostname}, `--source "nope" is not an IP address`},
			{"unknown host", []string{"--rate", "1", "--duration", "1s", "no-such-node"}, `node "no-such-node" not found`},
			{"unknown host, jump", []string{"--jump", "--rate", "1", "--duration", "1s", "no-such-node"}, `node "no-such-node" not found`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, errOut, code := e.run(t, "", append([]string{"bench", "ssh"}, tc.args...)...)
				require.NotEqual(t, 0, code)
				requireOneLineError(t, errOut, tc.want)
			})
		}
	})

}
