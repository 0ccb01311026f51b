package srv

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/party"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// observerRounds is how many times each arm of BenchmarkSessionObservers
// runs, alternating, so that the noise of shared CPUs hits both alike.
const observerRounds = 6

// benchObserverCount is the load target's number of observers.
const benchObserverCount = 20

// BenchmarkSessionObservers: the owner's throughput on a busy pty
// session (`cat /dev/zero`) with no observer and with 20, side by side:
// the two arms alternate observerRounds times within one run, and the
// figure that matters is ratio-median, the median over rounds of (owner
// MB/s with 20 observers) / (without). "local" observers subscribe to the
// room in-process and drain it (the fan-out's own cost on the output
// path); "ssh" observers join over SSH like psh join (add the encryption
// of 20 more streams on the node, and their decryption by the benchmark's
// own clients, on the same CPUs). The observers join, and every one has
// read its first screen, before the timed window opens: what is timed is
// the steady state of a watched session, not 20 joins.
//
// cpu-ms/MB-0 and cpu-ms/MB-20 are the process's CPU time (node and the
// benchmark's clients together) per MB of the owner's output in each arm.
func BenchmarkSessionObservers(b *testing.B) {
	for _, overSSH := range []bool{false, true} {
		b.Run(map[bool]string{false: "local", true: "ssh"}[overSSH], func(b *testing.B) { benchObservers(b, overSSH) })
	}
}

func benchObservers(b *testing.B, overSSH bool) {
	e := benchEnv(b)
	e.ap.UpsertRole(&services.Role{Kind: services.KindRole, Metadata: services.Metadata{Name: "auditor"}, Spec: services.RoleSpec{
		JoinSessions: []services.SessionJoinRule{{Roles: []string{"access"}, Modes: []string{"observer"}}},
	}})
	c, err := ssh.Dial("tcp", e.addr, aesFirst(e.clientConfig(e.me, e.signer(e.me))))
	require.NoError(b, err)
	defer c.Close()
	s, err := c.NewSession()
	require.NoError(b, err)
	defer s.Close()
	out, err := s.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, s.RequestPty("xterm", 40, 120, ssh.TerminalModes{}))
	require.NoError(b, s.Start("exec cat /dev/zero"))
	_, err = io.CopyN(io.Discard, out, benchChunk)
	require.NoError(b, err)
	rooms := e.srv.parties.List()
	require.Len(b, rooms, 1)
	room := rooms[0]
	window := int64(b.N) * benchChunk

	// The owner's output is read all along, between the timed windows
	// too: a joiner is announced on the owner's channel, which must
	// not be stalled by a reader that paused.
	owner := &ownerReader{more: make(chan struct{}, 1)}
	go owner.run(out)
	// timed reads window bytes of the owner's output: MB/s and CPU ms/MB.
	timed := func() (mbps, cpuPerMB float64) {
		cpu0 := cpuTime()
		start := time.Now()
		b.StartTimer()
		require.NoError(b, owner.await(owner.read()+window))
		b.StopTimer()
		d := time.Since(start)
		cpu := cpuTime() - cpu0
		mb := float64(window) / 1e6
		return mb / d.Seconds(), float64(cpu.Milliseconds()) / mb
	}
	var ratios, cpu0s, cpu20s, mb0s, mb20s []float64
	b.StopTimer()
	b.SetBytes(2 * observerRounds * benchChunk)
	b.ResetTimer()
	b.StopTimer()
	for r := 0; r < observerRounds; r++ {
		var mb0, mb20, c0, c20 float64
		watched := func() {
			stop := startObservers(b, e, room, overSSH)
			mb20, c20 = timed()
			stop()
		}
		if r%2 == 0 {
			mb0, c0 = timed()
			watched()
		} else {
			watched()
			mb0, c0 = timed()
		}
		ratios = append(ratios, mb20/mb0)
		mb0s, mb20s, cpu0s, cpu20s = append(mb0s, mb0), append(mb20s, mb20), append(cpu0s, c0), append(cpu20s, c20)
	}
	b.ReportMetric(median(ratios), "ratio-median")
	b.ReportMetric(median(mb0s), "MB/s-0")
	b.ReportMetric(median(mb20s), "MB/s-20")
	b.ReportMetric(median(cpu0s), "cpu-ms/MB-0")
	b.ReportMetric(median(cpu20s), "cpu-ms/MB-20")
}

// ownerReader drains the owner's output, counting it.
type ownerReader struct {
	mu   sync.Mutex
	n    int64
	err  error
	more chan struct{}
}

func (o *ownerReader) run(r io.Reader) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		o.mu.Lock()
		o.n += int64(n)
		o.err = err
		o.mu.Unlock()
		select {
		case o.more <- struct{}{}:
		default:
		}
		if err != nil {
			return
		}
	}
}

func (o *ownerReader) read() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// await returns once n bytes in all were read.
func (o *ownerReader) await(n int64) error {
	for {
		o.mu.Lock()
		got, err := o.n, o.err
		o.mu.Unlock()
		if got >= n {
			return nil
		}
		if err != nil {
			return err
		}
		<-o.more
	}
}

// startObservers joins benchObserverCount observers to room and returns
// once every one has read its first screen; stop makes them leave and
// returns once the room has none.
func startObservers(b *testing.B, e *testEnv, room *party.Session, overSSH bool) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var firstScreens sync.WaitGroup
	for i := 0; i < benchObserverCount; i++ {
		firstScreens.Add(1)
		if !overSSH {
			sub, err := room.Out.Subscribe()
			require.NoError(b, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer sub.Close()
				first := true
				for {
					if _, err := sub.Next(ctx); err != nil {
						if first {
							firstScreens.Done()
						}
						return
					}
					if first {
						first = false
						firstScreens.Done()
					}
				}
			}()
			continue
		}
		signer := e.userCA.UserSigner(b, srvtest.UserCert{User: fmt.Sprint("obs", i), Logins: []string{e.me}, Roles: []string{"access", "auditor"}, Cluster: testCluster, Now: e.clock.Now()})
		oc, err := ssh.Dial("tcp", e.addr, aesFirst(e.clientConfig(e.me, signer)))
		require.NoError(b, err)
		os, err := oc.NewSession()
		require.NoError(b, err)
		oout, err := os.StdoutPipe()
		require.NoError(b, err)
		require.NoError(b, os.RequestPty("xterm", 40, 120, ssh.TerminalModes{}))
		require.NoError(b, os.RequestSubsystem(party.JoinSubsystem(room.ID, party.Observer)))
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-ctx.Done()
			oc.Close()
		}()
		go func() {
			defer wg.Done()
			// The first read holds the first screen (the join's repaint
			// is the first thing a joiner is sent).
			buf := make([]byte, 32<<10)
			_, err := oout.Read(buf)
			firstScreens.Done()
			if err == nil {
				_, _ = io.Copy(io.Discard, oout)
			}
		}()
	}
	firstScreens.Wait()
	return func() {
		cancel()
		wg.Wait()
		require.Eventually(b, func() bool { return room.Out.Subscribers() == 0 }, 30*time.Second, time.Millisecond)
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
