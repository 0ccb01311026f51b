package limiter

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/observe"
)

// openSSHClient is the path of OpenSSH's ssh, or "" (the test part that
// needs it is skipped) outside CI; CI installs it, so there it is required.
func openSSHClient(t *testing.T) string {
	p, err := exec.LookPath("ssh")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("OpenSSH client not installed in CI: %v", err)
		}
		t.Log("OpenSSH client not installed; skipping its part")
		return ""
	}
	return p
}

// acceptLoop accepts on ln until it closes, handing connections to conns.
func acceptLoop(t *testing.T, ln net.Listener) <-chan net.Conn {
	conns := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(conns)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for c := range conns {
			c.Close()
		}
	})
	return conns
}

func TestWrapListenerPerIP(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lim, reg := newTestLimiter(t, Config{Name: "proxy_ssh", MaxConnectionsPerIP: 2})
	ln := WrapListener(raw, lim, ListenerOptions{Refusal: SSHRefusal})
	conns := acceptLoop(t, ln)

	var clients []net.Conn
	var served []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", raw.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		clients = append(clients, c)
		served = append(served, <-conns)
	}
	require.Equal(t, 2, lim.Count(CapIP, "127.0.0.1"))

	// The third gets a readable line, then a version and an SSH
	// disconnect, then EOF: a refusal, not a hang.
	c3, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer c3.Close()
	br := bufio.NewReader(c3)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "postern: too many connections from 127.0.0.1: limit 2\r\n", line)
	line, err = br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "SSH-2.0-Postern\r\n", line)
	rest, err := io.ReadAll(br)
	require.NoError(t, err, "EOF after the disconnect packet")
	require.Contains(t, string(rest), "too many connections from 127.0.0.1: limit 2")
	require.Equal(t, 1.0, metricValue(t, reg, "postern_limiter_refusals_total", map[string]string{"cap": CapIP}))

	// A real SSH client is told why, as its handshake error...
	cx, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer cx.Close()
	_, _, _, err = ssh.NewClientConn(cx, raw.Addr().String(), &ssh.ClientConfig{User: "u", HostKeyCallback: ssh.InsecureIgnoreHostKey()})
	require.ErrorContains(t, err, `reason 12: "postern: too many connections from 127.0.0.1: limit 2"`)
	// ...and so is OpenSSH, at its default log level (no -v).
	if sshBin := openSSHClient(t); sshBin != "" {
		host, port, _ := net.SplitHostPort(raw.Addr().String())
		out, err := exec.Command(sshBin, "-F", "/dev/null", "-p", port, "-o", "BatchMode=yes",
			"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "u@"+host, "true").CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "too many connections from 127.0.0.1: limit 2", string(out))
	}

	// The accepted connections work, half-close included.
	_, err = clients[0].Write([]byte("x"))
	require.NoError(t, err)
	buf := make([]byte, 1)
	_, err = io.ReadFull(served[0], buf)
	require.NoError(t, err)
	require.NoError(t, served[0].(interface{ CloseWrite() error }).CloseWrite())
	_, err = clients[0].Read(buf)
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, raw.Addr().String(), served[0].(interface{ Unwrap() net.Conn }).Unwrap().LocalAddr().String())

	// Closing a served connection frees its slot for the next client.
	require.NoError(t, served[0].Close())
	_ = served[0].Close() // a second Close must not free a second slot
	require.Equal(t, 1, lim.Count(CapIP, "127.0.0.1"))
	c4, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer c4.Close()
	s4 := <-conns
	defer s4.Close()
	require.Equal(t, 2, lim.Count(CapIP, "127.0.0.1"))
	served[1].Close()
}

func TestWrapListenerRate(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lim, _ := newTestLimiter(t, Config{})
	clock := clockwork.NewFakeClock()
	rl, err := NewRateLimiter(RateConfig{Rate: 1, Burst: 1, Deps: observe.Deps{Clock: clock}})
	require.NoError(t, err)
	// No Refusal: closed without a word (what a TLS port wants).
	ln := WrapListener(raw, lim, ListenerOptions{Rate: rl})
	conns := acceptLoop(t, ln)

	c1, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer c1.Close()
	s1 := <-conns
	defer s1.Close()

	c2, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer c2.Close()
	n, err := c2.Read(make([]byte, 16))
	require.Equal(t, 0, n)
	require.Error(t, err, "refused connection is closed at once")

	clock.Advance(time.Second)
	c3, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer c3.Close()
	s3 := <-conns
	s3.Close()
	require.Equal(t, 1, lim.Count(CapConnections, ""), "the refused one never took a slot")
}

func TestHTTPMiddleware(t *testing.T) {
	lim, _ := newTestLimiter(t, Config{MaxSessionsPerUser: 1})
	inside := make(chan struct{})
	proceed := make(chan struct{})
	h := HTTPMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inside)
		<-proceed
		w.WriteHeader(http.StatusNoContent)
	}), func(r *http.Request) (func(), error) {
		if r.Header.Get("X-User") == "" {
			return nil, trace.ConnectionProblem(nil, "backend down")
		}
		return lim.AcquireSession(r.Header.Get("X-User"))
	})
	srv := httptest.NewServer(h)
	defer srv.Close()

	req := func() *http.Response {
		r, err := http.NewRequest(http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		r.Header.Set("X-User", "alice")
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		return resp
	}
	first := make(chan *http.Response, 1)
	go func() { first <- req() }()
	<-inside
	resp := req()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	var body map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Equal(t, `too many sessions for user "alice": limit 1`, body["error"])
	close(proceed)
	resp = <-first
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Equal(t, 0, lim.Count(CapSessions, "alice"), "released when the handler returns")

	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	http.DefaultClient.CloseIdleConnections()
}

// TestWrapListenerReportsRefusals: refusals reach OnRefuse at once for a
// new address and cap, then at most once per interval with the count
// refused meanwhile.
func TestWrapListenerReportsRefusals(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	lim, _ := newTestLimiter(t, Config{Name: "proxy_ssh", MaxConnectionsPerIP: 1, Deps: observe.Deps{Clock: clock}})
	reports := make(chan Refusal, 16)
	ln := WrapListener(raw, lim, ListenerOptions{Refusal: SSHRefusal, OnRefuse: func(r Refusal) { reports <- r }})
	conns := acceptLoop(t, ln)

	held, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer held.Close()
	s := <-conns
	defer s.Close()

	refused := func() {
		t.Helper()
		c, err := net.Dial("tcp", raw.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		// The report is made before the connection is closed: EOF means
		// it is done.
		_, err = io.ReadAll(c)
		require.NoError(t, err)
	}
	refused()
	r := <-reports
	require.Equal(t, "proxy_ssh", r.Listener)
	require.Equal(t, CapIP, r.Cap)
	require.Equal(t, "127.0.0.1", r.Key)
	require.Equal(t, 1, r.Count)
	require.Contains(t, r.Err.Error(), "too many connections from 127.0.0.1: limit 1")
	host, _, err := net.SplitHostPort(r.Addr.String())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)

	refused()
	refused()
	require.Empty(t, reports, "throttled within the interval")
	clock.Advance(RefusalReportInterval)
	refused()
	r = <-reports
	require.Equal(t, 3, r.Count, "the two throttled and this one")
}
