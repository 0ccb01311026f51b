package web

import (
	"os"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
)

// TestMeasureWebTerminal measures, with POSTERN_MEASURE=1, a keystroke's
// echo through the web terminal (websocket -> proxy -> SSH -> the test
// node's echo -> back, resumable dialect) against the same keystroke from
// an x/crypto client straight to the node with the web session's own
// certificate, and the proxy's heap per detached terminal. It measures;
// it does not judge (the numbers vary with the machine).
func TestMeasureWebTerminal(t *testing.T) {
	if os.Getenv("POSTERN_MEASURE") == "" {
		t.Skip("set POSTERN_MEASURE=1 to measure")
	}
	const rounds = 2000
	e := newTermEnv(t)
	ctx := testCtx(t)
	ws := e.login(t)

	sc := e.openSeq(t, ctx, ws, "", 0)
	sc.ok(t, ctx)
	sc.readUntil(t, ctx, "prompt$ ")
	web := make([]time.Duration, rounds)
	for i := range web {
		sc.out.Reset()
		start := time.Now()
		sc.send(t, ctx, "k")
		sc.readUntil(t, ctx, "k")
		web[i] = time.Since(start)
	}

	live := e.server.web.sessions.get(hexKey(ws))
	client, err := ssh.Dial("tcp", e.node.addr(), &ssh.ClientConfig{
		User: "alice", Auth: []ssh.AuthMethod{ssh.PublicKeys(live.signer)},
		HostKeyCallback: authz.HostKeyCallback(live.hostCAs, clockwork.NewRealClock()), Timeout: 10 * time.Second,
	})
	require.NoError(t, err)
	defer client.Close()
	sess, err := client.NewSession()
	require.NoError(t, err)
	stdin, err := sess.StdinPipe()
	require.NoError(t, err)
	stdout, err := sess.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, sess.RequestPty("xterm", 24, 80, ssh.TerminalModes{}))
	require.NoError(t, sess.Shell())
	buf := make([]byte, 64)
	_, err = stdout.Read(buf) // the prompt
	require.NoError(t, err)
	direct := make([]time.Duration, rounds)
	for i := range direct {
		start := time.Now()
		_, err := stdin.Write([]byte("k"))
		require.NoError(t, err)
		_, err = stdout.Read(buf)
		require.NoError(t, err)
		direct[i] = time.Since(start)
	}
	med := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	p99 := func(d []time.Duration) time.Duration { return d[len(d)*99/100] }
	mw, md := med(web), med(direct)
	t.Logf("keystroke echo: web terminal median %v p99 %v; direct SSH median %v p99 %v; web/direct %.2fx",
		mw, p99(web), md, p99(direct), float64(mw)/float64(md))

	// The test node buffers 16 shell starts and ends: stay under it.
	const n = 12
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()
	for j := 0; j < n; j++ {
		sc := e.openSeq(t, ctx, ws, "", 0)
		sc.ok(t, ctx)
		sc.readUntil(t, ctx, "prompt$ ")
		sc.c.CloseNow()
		id := sc.session.ID
		require.Eventually(t, func() bool { return e.detached(id) }, testTimeout, time.Millisecond)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("detached terminals: %d KiB heap and %.1f goroutines each (the in-process test node's half included)",
		(after.HeapInuse-before.HeapInuse)/n/1024, float64(runtime.NumGoroutine()-goroutines)/n)
}
