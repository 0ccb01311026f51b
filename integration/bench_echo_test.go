package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"
	"github.com/gravitational/trace"
	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/lib/api/webterm"
	"github.com/postern-dev/postern/lib/web"
)

// echoSetup makes the remote side echo every byte exactly once, as soon as
// it arrives: the pty neither echoes nor buffers lines (raw -echo) and cat
// writes back what it reads. The quotes keep the marker out of the echoed
// command line, so seeing READY means the setup ran.
const echoSetup = "stty raw -echo; echo REA''DY; exec cat\n"

// echoRoundTimeout bounds one keystroke's round trip.
const echoRoundTimeout = 20 * time.Second

// echoSetupTimeout bounds opening a terminal up to its echo: the login
// shell's start-up (root's ~/.bashrc runs pyenv init here) can take tens
// of seconds on a loaded machine.
const echoSetupTimeout = 3 * time.Minute

// BenchmarkEchoLatency is issue 16's side-by-side: one keystroke's echo
// through the web terminal (websocket -> proxy -> node -> the remote pty
// and back, resumable dialect) against the same keystroke through the real
// `psh ssh -t` binary run under a local pty, to the same node and login on
// one real all-in-one postern. The arms alternate within every op (and swap
// order on odd ops), so both see the same machine load. It reports each
// arm's p50 and p99 and the ratio web/psh. The "detached" sub-benchmark
// is the heap the cluster keeps per detached web terminal.
//
//	go test -run '^$' -bench EchoLatency ./integration/
//
// The cluster is built once here: a benchmark with sub-benchmarks runs its
// own body once, while each sub-benchmark's body is re-run with growing N.
func BenchmarkEchoLatency(b *testing.B) {
	c := newAllInOne(b)
	e := newPshEnv(b, c)
	e.login(b, "alice", alicePassword+"\n")
	wc := webTermLogin(b, c)
	heapPerDetached, goroutinesPerDetached := measureDetached(b, wc, c)

	// Both shells start at once, before any op: their start-up is not
	// measured, and every run of the sub-benchmark reuses them.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	type opened struct {
		pt  *pshEcho
		err error
	}
	pshc := make(chan opened, 1)
	go func() { pt, err := openPshEcho(ctx, e, c); pshc <- opened{pt, err} }()
	wt, werr := openWebEcho(ctx, wc, c, true)
	po := <-pshc
	if werr == nil {
		defer wt.close()
	}
	if po.err == nil {
		defer po.pt.close()
	}
	if werr != nil || po.err != nil {
		b.Fatalf("opening the terminals: web: %v; psh ssh -t: %v", werr, po.err)
	}
	pt := po.pt

	b.Run("keystroke", func(b *testing.B) {
		webD := make([]time.Duration, 0, b.N)
		pshD := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			key := byte('a' + i%26)
			arms := []func() error{
				func() error { d, err := wt.roundTrip(ctx, key); webD = append(webD, d); return err },
				func() error { d, err := pt.roundTrip(ctx, key); pshD = append(pshD, d); return err },
			}
			if i%2 == 1 {
				arms[0], arms[1] = arms[1], arms[0]
			}
			for _, arm := range arms {
				if err := arm(); err != nil {
					b.Fatalf("round %d: %v", i, err)
				}
			}
		}
		b.StopTimer()
		wp50, wp99 := percentiles(webD)
		pp50, pp99 := percentiles(pshD)
		b.ReportMetric(float64(wp50.Microseconds()), "web_p50_us")
		b.ReportMetric(float64(wp99.Microseconds()), "web_p99_us")
		b.ReportMetric(float64(pp50.Microseconds()), "psh_p50_us")
		b.ReportMetric(float64(pp99.Microseconds()), "psh_p99_us")
		b.ReportMetric(float64(wp50)/float64(pp50), "ratio_p50")
		b.ReportMetric(float64(wp99)/float64(pp99), "ratio_p99")
	})

	// The heap is measured once, here, not per op: every op would leave
	// a shell behind.
	b.Run("detached", func(b *testing.B) {
		for range b.N {
		}
		b.ReportMetric(heapPerDetached, "heap_KiB/detached")
		b.ReportMetric(goroutinesPerDetached, "goroutines/detached")
		b.ReportMetric(0, "ns/op")
	})
}

// detachedTerminals is how many terminals the heap measurement detaches:
// enough to average out the noise of a collection, few enough shells.
const detachedTerminals = 8

// measureDetached opens detachedTerminals web terminals, detaches them (the
// socket goes away, the shell stays for the grace period) and returns the
// heap and goroutines each costs; then it ends them.
func measureDetached(b *testing.B, wc *webTermClient, c *allInOne) (heapKiB, goroutines float64) {
	ctx, cancel := context.WithTimeout(context.Background(), echoSetupTimeout)
	defer cancel()
	before := detachedHeap()
	var ids []string
	defer func() {
		for _, id := range ids {
			if err := wc.endTerminal(ctx, id); err != nil {
				b.Errorf("ending terminal %s: %v", id, err)
			}
		}
	}()
	for i := 0; i < detachedTerminals; i++ {
		wt, err := openWebEcho(ctx, wc, c, false)
		if err != nil {
			b.Fatalf("web terminal %d: %v", i, err)
		}
		ids = append(ids, wt.info.ID)
		wt.ws.CloseNow() // the browser goes away; the terminal waits for a resume
	}
	if err := waitDetached(ctx, wc, ids); err != nil {
		b.Fatal(err)
	}
	after := detachedHeap()
	n := float64(detachedTerminals)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n / 1024, float64(after.goroutines-before.goroutines) / n
}

type heapSample struct {
	runtime.MemStats
	goroutines int
}

// detachedHeap is the live heap after a collection. The cluster (auth,
// proxy and node) runs in this process, so a detached terminal's share
// is the proxy's half (SSH client, output buffer, screen emulator) plus
// the node's half of the same SSH session; the shell is its own process.
func detachedHeap() heapSample {
	runtime.GC()
	runtime.GC()
	var s heapSample
	runtime.ReadMemStats(&s.MemStats)
	s.goroutines = runtime.NumGoroutine()
	return s
}

// do sends an authenticated web API request and decodes the JSON answer
// into out (when not nil).
func (wc *webTermClient) do(ctx context.Context, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "https://"+wc.addr+path, nil)
	if err != nil {
		return trace.Wrap(err)
	}
	req.Header.Set("Authorization", "Bearer "+wc.token)
	req.AddCookie(wc.cookie)
	resp, err := wc.hc.Do(req)
	if err != nil {
		return trace.ConnectionProblem(err, "%s %s", method, path)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return trace.BadParameter("%s %s: %s", method, path, resp.Status)
	}
	if out == nil {
		return nil
	}
	return trace.Wrap(json.NewDecoder(resp.Body).Decode(out), "%s %s", method, path)
}

// endTerminal ends a terminal, detached or not (DELETE /webapi/terminals/ID).
func (wc *webTermClient) endTerminal(ctx context.Context, id string) error {
	return wc.do(ctx, http.MethodDelete, "/webapi/terminals/"+url.PathEscape(id), nil)
}

// waitDetached polls GET /webapi/terminals until every terminal of ids is
// listed as detached: the proxy notices a vanished socket asynchronously.
func waitDetached(ctx context.Context, wc *webTermClient, ids []string) error {
	ctx, cancel := context.WithTimeout(ctx, echoRoundTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var list web.TerminalsResponse
		if err := wc.do(ctx, http.MethodGet, "/webapi/terminals", &list); err != nil {
			return err
		}
		detached := map[string]bool{}
		for _, it := range list.Items {
			detached[it.ID] = it.State == "detached"
		}
		missing := 0
		for _, id := range ids {
			if !detached[id] {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return trace.LimitExceeded("%d of %d terminals never showed as detached", missing, len(ids))
		case <-tick.C:
		}
	}
}

// percentiles returns the p50 and p99 of d (sorted in place).
func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[min(len(d)-1, len(d)*99/100)]
}

// webEcho is a web terminal in the resumable dialect whose remote side
// runs echoSetup.
type webEcho struct {
	ws   *websocket.Conn
	info webterm.Session
}

// openWebEcho opens a terminal and waits for its FrameSession; with echo,
// it also runs echoSetup and waits until the remote side echoes.
func openWebEcho(ctx context.Context, wc *webTermClient, c *allInOne, echo bool) (*webEcho, error) {
	params, err := json.Marshal(webterm.TerminalParams{Host: c.hostname, Login: c.login, Cols: 80, Rows: 24})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	dctx, cancel := context.WithTimeout(ctx, echoSetupTimeout)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, "wss://"+wc.addr+"/webapi/terminal?params="+url.QueryEscape(string(params)), &websocket.DialOptions{
		HTTPClient:   wc.hc,
		HTTPHeader:   http.Header{"Cookie": {web.SessionCookieName + "=" + wc.cookie.Value}},
		Subprotocols: []string{webterm.TerminalSubprotocol},
	})
	if err != nil {
		return nil, trace.ConnectionProblem(err, "dialing the terminal")
	}
	w := &webEcho{ws: ws}
	ws.SetReadLimit(1 << 20)
	ack := uint64(0)
	first, _ := json.Marshal(webterm.AuthMessage{Token: wc.token, Ack: &ack})
	if err := ws.Write(dctx, websocket.MessageText, first); err != nil {
		w.close()
		return nil, trace.Wrap(err)
	}
	if _, msg, err := ws.Read(dctx); err != nil || !bytes.Contains(msg, []byte(`"ok"`)) {
		w.close()
		return nil, trace.AccessDenied("terminal auth: %q %v", msg, err)
	}
	if !echo {
		if err := w.readSession(dctx); err != nil {
			w.close()
			return nil, trace.Wrap(err)
		}
		return w, nil
	}
	if err := ws.Write(dctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameData, []byte(echoSetup))); err != nil {
		w.close()
		return nil, trace.Wrap(err)
	}
	if err := w.readUntil(dctx, []byte("READY")); err != nil {
		w.close()
		return nil, trace.Wrap(err, "waiting for the remote echo")
	}
	return w, nil
}

// readSession reads frames until FrameSession: the terminal has started.
func (w *webEcho) readSession(ctx context.Context) error {
	for w.info.ID == "" {
		if err := w.readFrame(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

// readUntil reads frames until the output so far contains want.
func (w *webEcho) readUntil(ctx context.Context, want []byte) error {
	var out []byte
	for !bytes.Contains(out, want) {
		if err := w.readFrame(ctx, &out); err != nil {
			return trace.Wrap(err, "output so far %q", out)
		}
	}
	return nil
}

// readFrame reads one frame, appending terminal output to out.
func (w *webEcho) readFrame(ctx context.Context, out *[]byte) error {
	_, msg, err := w.ws.Read(ctx)
	if err != nil {
		return trace.Wrap(err)
	}
	f, err := webterm.DecodeFrame(msg)
	if err != nil {
		return trace.Wrap(err)
	}
	switch f.Type {
	case webterm.FrameSession:
		return trace.Wrap(json.Unmarshal(f.Payload, &w.info))
	case webterm.FrameError:
		return trace.ConnectionProblem(nil, "terminal error: %s", f.Payload)
	case webterm.FrameClose:
		return trace.ConnectionProblem(nil, "terminal closed: %s", f.Payload)
	case webterm.FrameData:
		_, data, err := webterm.DecodeSeq(f.Payload)
		if err != nil {
			return trace.Wrap(err)
		}
		if out != nil {
			*out = append(*out, data...)
		}
	}
	return nil
}

// roundTrip sends key as one FrameData, as the browser does per keystroke,
// and times until an output frame carries it back.
func (w *webEcho) roundTrip(ctx context.Context, key byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, echoRoundTimeout)
	defer cancel()
	frame := webterm.EncodeFrame(webterm.FrameData, []byte{key})
	start := time.Now()
	if err := w.ws.Write(ctx, websocket.MessageBinary, frame); err != nil {
		return 0, trace.Wrap(err)
	}
	if err := w.readUntil(ctx, []byte{key}); err != nil {
		return 0, trace.Wrap(err, "web echo of %q", key)
	}
	return time.Since(start), nil
}

// close ends the terminal (FrameClose, not a detach: nothing is left to
// the grace period) and the socket.
func (w *webEcho) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.ws.Write(ctx, websocket.MessageBinary, webterm.EncodeFrame(webterm.FrameClose, []byte(`{"code":0,"reason":"bench done"}`)))
	w.ws.CloseNow()
}

// pshEcho is `psh ssh -t` under a local pty, its output pumped into a
// channel so that every wait has a deadline.
type pshEcho struct {
	cmd  *exec.Cmd
	ptmx *os.File
	out  chan []byte
	done chan struct{}
}

func openPshEcho(ctx context.Context, e *pshEnv, c *allInOne) (*pshEcho, error) {
	cmd := e.cmd("", "ssh", "-t", c.login+"@"+c.hostname)
	cmd.Stdin = nil
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	p := &pshEcho{cmd: cmd, ptmx: ptmx, out: make(chan []byte, 64), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer close(p.out)
		for {
			buf := make([]byte, 4096)
			n, err := ptmx.Read(buf)
			if n > 0 {
				p.out <- buf[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	sctx, cancel := context.WithTimeout(ctx, echoSetupTimeout)
	defer cancel()
	// The first output is the remote shell's prompt, which psh relays only
	// after it has put the local pty in raw mode: from here on, nothing
	// this side echoes.
	if _, err := p.recv(sctx); err != nil {
		p.close()
		return nil, trace.Wrap(err, "waiting for the remote prompt")
	}
	tio, err := unix.IoctlGetTermios(int(ptmx.Fd()), unix.TCGETS)
	if err != nil {
		p.close()
		return nil, trace.Wrap(err)
	}
	if tio.Lflag&(unix.ECHO|unix.ICANON) != 0 {
		p.close()
		return nil, trace.BadParameter("psh left the local pty echoing (lflag %#x): the echo would not be the remote's", tio.Lflag)
	}
	if _, err := ptmx.Write([]byte(echoSetup)); err != nil {
		p.close()
		return nil, trace.Wrap(err)
	}
	if err := p.readUntil(sctx, []byte("READY")); err != nil {
		p.close()
		return nil, trace.Wrap(err, "waiting for the remote echo")
	}
	return p, nil
}

func (p *pshEcho) recv(ctx context.Context) ([]byte, error) {
	select {
	case b, ok := <-p.out:
		if !ok {
			return nil, trace.ConnectionProblem(nil, "psh exited")
		}
		return b, nil
	case <-ctx.Done():
		return nil, trace.Wrap(ctx.Err())
	}
}

func (p *pshEcho) readUntil(ctx context.Context, want []byte) error {
	var out []byte
	for !bytes.Contains(out, want) {
		b, err := p.recv(ctx)
		if err != nil {
			return trace.Wrap(err, "output so far %q", out)
		}
		out = append(out, b...)
	}
	return nil
}

// roundTrip writes key to psh's terminal, as a typing user does, and
// times until psh prints it back from the remote side.
func (p *pshEcho) roundTrip(ctx context.Context, key byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, echoRoundTimeout)
	defer cancel()
	start := time.Now()
	if _, err := p.ptmx.Write([]byte{key}); err != nil {
		return 0, trace.Wrap(err)
	}
	if err := p.readUntil(ctx, []byte{key}); err != nil {
		return 0, trace.Wrap(err, "psh echo of %q", key)
	}
	return time.Since(start), nil
}

// close ends psh (the remote cat goes with its session) and waits for it
// and the pump.
func (p *pshEcho) close() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.ptmx.Close()
	for range p.out {
	}
	<-p.done
}
