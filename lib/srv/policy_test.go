package srv

import (
	"io"
	"net"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// The SSH vocabulary a client can send: RFC 4254, OpenSSH's PROTOCOL
// (…@openssh.com) and x/crypto's names, plus names nobody defines.
// Channel types only a server opens (forwarded-tcpip, x11,
// auth-agent@openssh.com) are in it too: a client may send anything.
var (
	vocabularyChannels = []string{
		"session", "direct-tcpip", "forwarded-tcpip", "x11", "auth-agent@openssh.com",
		"direct-streamlocal@openssh.com", "forwarded-streamlocal@openssh.com", "tun@openssh.com",
		"unknown-channel@example.com", "",
	}
	vocabularyGlobal = []string{
		"tcpip-forward", "cancel-tcpip-forward", "streamlocal-forward@openssh.com",
		"cancel-streamlocal-forward@openssh.com", "keepalive@openssh.com", "no-more-sessions@openssh.com",
		"hostkeys-00@openssh.com", "hostkeys-prove-00@openssh.com", "unknown-global@example.com", "",
	}
	vocabularySession = []string{
		"pty-req", "env", "shell", "exec", "subsystem", "window-change", "signal", "break", "xon-xoff",
		"exit-status", "exit-signal", "eow@openssh.com", "auth-agent-req@openssh.com", "x11-req",
		"keepalive@openssh.com", "unknown-request@example.com", "",
	}
)

// modeEnv is a server in one mode and a client connected to it.
type modeEnv struct {
	echo  string
	e     *testEnv
	clt   *ssh.Client
	proxy *fakeProxy
}

func newModeEnv(t *testing.T, mode string) *modeEnv {
	echo := echoServer(t)
	m := &modeEnv{echo: echo}
	if mode == "proxy" {
		m.proxy = &fakeProxy{target: echo, asked: make(chan string, 64)}
		m.e = newTestEnv(t, func(c *Config) { c.Proxy = m.proxy; c.GetNode = nil })
	} else {
		m.e = newTestEnv(t)
	}
	m.clt = m.e.dial()
	return m
}

// askedProxy returns what the server handed to the ProxyHandler so far.
func (m *modeEnv) askedProxy() []string {
	if m.proxy == nil {
		return nil
	}
	var out []string
	for {
		select {
		case a := <-m.proxy.asked:
			out = append(out, a)
		default:
			return out
		}
	}
}

// sessionOutcome is what one session request led to.
type sessionOutcome struct {
	ok bool
	// ended: the server ended the session, with exit status exit (-1:
	// the channel closed without one) and stdout and stderr as read;
	// false when the session stayed open.
	ended          bool
	exit           int
	stdout, stderr string
}

// openSession opens a raw session channel; exit receives its exit-status.
func openSession(t *testing.T, clt *ssh.Client) (ssh.Channel, <-chan int) {
	t.Helper()
	ch, reqs, err := clt.OpenChannel("session", nil)
	require.NoError(t, err)
	exit := make(chan int, 1)
	go func() {
		for r := range reqs {
			if r.Type == "exit-status" {
				var st exitStatus
				if ssh.Unmarshal(r.Payload, &st) == nil {
					exit <- int(st.Status)
				}
			}
			if r.WantReply {
				_ = r.Reply(false, nil)
			}
		}
		close(exit)
	}()
	return ch, exit
}

type request struct {
	name    string
	payload []byte
}

// sendSession sends prep then req on a fresh session and reports the
// outcome of req. input is written to the session before stdin closes
// when the server is expected to end it.
func sendSession(t *testing.T, clt *ssh.Client, prep []request, req request, expectEnd bool, input string) sessionOutcome {
	t.Helper()
	ch, exit := openSession(t, clt)
	defer ch.Close()
	for _, p := range prep {
		ok, err := ch.SendRequest(p.name, true, p.payload)
		require.NoError(t, err)
		require.True(t, ok, "preparing request %q refused", p.name)
	}
	ok, err := ch.SendRequest(req.name, true, req.payload)
	require.NoError(t, err)
	out := sessionOutcome{ok: ok}
	if !expectEnd {
		return out
	}
	if input != "" {
		_, err := ch.Write([]byte(input))
		require.NoError(t, err)
	}
	// The server may have ended the session already (a refusal).
	_ = ch.CloseWrite()
	stderrDone := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(ch.Stderr())
		stderrDone <- string(b)
	}()
	stdout, err := io.ReadAll(ch)
	require.NoError(t, err)
	out.stdout = string(stdout)
	out.stderr = <-stderrDone
	guard := time.NewTimer(15 * time.Second)
	defer guard.Stop()
	out.ended, out.exit = true, -1
	select {
	case st, got := <-exit:
		if got {
			out.exit = st
		}
	case <-guard.C:
		t.Fatalf("request %q: no exit status", req.name)
	}
	return out
}

// TestModePolicy walks every channel type, global request and session
// request in the SSH vocabulary against a real server in node mode and in
// proxy mode, with a real x/crypto client, and asserts what each mode
// does. Anything not served is refused the same way in both modes.
func TestModePolicy(t *testing.T) {
	t.Run("served names are exactly these", func(t *testing.T) {
		// A new entry in a policy must come with a row below, and every
		// served name is in the vocabulary the rows walk.
		node, prx := nodePolicy(), proxyPolicy()
		require.Equal(t, []string{"direct-tcpip", "session"}, served(node.channels))
		require.Equal(t, []string{"direct-tcpip", "session"}, served(prx.channels))
		require.Equal(t, []string{"cancel-tcpip-forward", "tcpip-forward"}, served(node.global))
		require.Equal(t, []string{"tcpip-forward"}, served(prx.global), "the proxy's tcpip-forward entry only refuses, with an audit event")
		sessionReqs := []string{"auth-agent-req@openssh.com", "env", "exec", "pty-req", "shell", "signal", "subsystem", "window-change", "x11-req"}
		require.Equal(t, sessionReqs, served(node.session))
		require.Equal(t, sessionReqs, served(prx.session))
		for _, p := range []*policy{node, prx} {
			for _, names := range [][]string{served(p.channels), served(p.global), served(p.session)} {
				for _, n := range names {
					require.True(t, contains(vocabularyChannels, n) || contains(vocabularyGlobal, n) || contains(vocabularySession, n), "%s serves %q, which no row walks", p.mode, n)
				}
			}
		}
		require.True(t, node.checkNode)
		require.False(t, prx.checkNode)
	})

	for _, mode := range []string{"node", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			m := newModeEnv(t, mode)
			isProxy := mode == "proxy"

			t.Run("channels", func(t *testing.T) {
				host, port, err := net.SplitHostPort(m.echo)
				require.NoError(t, err)
				p, err := strconv.Atoi(port)
				require.NoError(t, err)
				tcpip := ssh.Marshal(directTCPIPPayload{Host: host, Port: uint32(p), OriginHost: "127.0.0.1", OriginPort: 5000})
				for _, typ := range vocabularyChannels {
					var payload []byte
					if typ == "direct-tcpip" {
						payload = tcpip
					}
					ch, reqs, err := m.clt.OpenChannel(typ, payload)
					switch typ {
					case "session", "direct-tcpip":
						require.NoError(t, err, typ)
						go ssh.DiscardRequests(reqs)
						if typ == "direct-tcpip" {
							// It reaches the echo server: the node dials
							// the target, the proxy its handler.
							echoRoundTrip(t, ch, "hi")
						}
						ch.Close()
					default:
						var oce *ssh.OpenChannelError
						require.ErrorAs(t, err, &oce, "channel type %q must be refused", typ)
						require.Equal(t, ssh.UnknownChannelType, oce.Reason, typ)
					}
				}
				asked := m.askedProxy()
				if isProxy {
					require.Equal(t, []string{"direct-tcpip"}, asked)
				}
			})

			t.Run("global requests", func(t *testing.T) {
				for _, name := range vocabularyGlobal {
					payload := ssh.Marshal(forwardRequest{Addr: "127.0.0.1", Port: 0})
					ok, resp, err := m.clt.SendRequest(name, true, payload)
					require.NoError(t, err, name)
					switch {
					case name == "tcpip-forward" && !isProxy:
						require.True(t, ok, "a node serves -R")
						var bound struct{ Port uint32 }
						require.NoError(t, ssh.Unmarshal(resp, &bound))
						ok, _, err := m.clt.SendRequest("cancel-tcpip-forward", true, ssh.Marshal(forwardRequest{Addr: "127.0.0.1", Port: bound.Port}))
						require.NoError(t, err)
						require.True(t, ok, "a node cancels the -R it serves")
					case name == "tcpip-forward":
						require.False(t, ok, "the proxy refuses -R")
						m.e.requireLog("tcpip-forward denied.", "remote port forwarding is not available on the proxy")
					default:
						require.False(t, ok, "global request %q must be refused in %s mode", name, mode)
					}
				}
				require.Empty(t, m.askedProxy())
			})

			pty := request{"pty-req", ssh.Marshal(ptyRequest{Term: "xterm", Columns: 80, Rows: 24})}
			sub := func(name string) request { return request{"subsystem", ssh.Marshal(subsystemRequest{Name: name})} }
			cases := []struct {
				name string
				prep []request
				req  request
				// node and proxy are the expected replies; end says the
				// server ends the session (then exit and stderr count).
				node, proxy         bool
				nodeEnd, proxyEnd   bool
				nodeExit, proxyExit int
				proxyStderr         string
				input, proxyStdout  string
				proxyAsked          string
			}{
				{name: "pty-req", req: pty, node: true, proxy: true},
				{name: "env allowed", req: request{"env", ssh.Marshal(envRequest{Name: "LANG", Value: "C"})}, node: true, proxy: true},
				{name: "env outside the allow-list", req: request{"env", ssh.Marshal(envRequest{Name: "LD_PRELOAD", Value: "/x.so"})}},
				{name: "shell", req: request{"shell", nil}, node: true, proxy: true, nodeEnd: true, proxyEnd: true, proxyExit: 1, proxyStderr: "ssh -J"},
				{name: "exec", req: request{"exec", ssh.Marshal(execRequest{Command: "exit 3"})}, node: true, proxy: true, nodeEnd: true, proxyEnd: true, nodeExit: 3, proxyExit: 1, proxyStderr: "ssh -J"},
				{name: "subsystem sftp", req: sub("sftp"), node: true, proxy: true, nodeEnd: true, proxyEnd: true, proxyExit: 1,
					proxyStderr: `invalid proxy subsystem request "sftp"`, proxyAsked: "subsystem:sftp"},
				// A tunnel ends with its channel, without an exit status.
				{name: "subsystem proxy:", req: sub("proxy:node1:3022@example"), proxy: true, proxyEnd: true, proxyExit: -1, input: "raw", proxyStdout: "raw", proxyAsked: "subsystem:proxy:node1:3022@example"},
				{name: "subsystem proxysites", req: sub("proxysites"), proxy: true, proxyEnd: true, proxyStdout: "[]", proxyAsked: "subsystem:proxysites"},
				{name: "subsystem nodes", req: sub("nodes"), proxy: true, proxyEnd: true, proxyStdout: "[]", proxyAsked: "subsystem:nodes"},
				{name: "subsystem unknown", req: sub("unknown"), proxy: true, proxyEnd: true, proxyExit: 1,
					proxyStderr: `invalid proxy subsystem request "unknown"`, proxyAsked: "subsystem:unknown"},
				{name: "window-change after pty-req", prep: []request{pty}, req: request{"window-change", ssh.Marshal(windowChange{Columns: 100, Rows: 30})}, node: true, proxy: true},
				{name: "window-change without a pty", req: request{"window-change", ssh.Marshal(windowChange{Columns: 100, Rows: 30})}},
				{name: "signal without a process", req: request{"signal", ssh.Marshal(signalRequest{Signal: "TERM"})}},
				{name: "break", req: request{"break", ssh.Marshal(struct{ Length uint32 }{500})}},
				{name: "xon-xoff", req: request{"xon-xoff", ssh.Marshal(struct{ ClientCanDo bool }{true})}},
				{name: "exit-status", req: request{"exit-status", ssh.Marshal(exitStatus{Status: 0})}},
				{name: "exit-signal", req: request{"exit-signal", ssh.Marshal(exitSignal{Signal: "KILL"})}},
				{name: "eow@openssh.com", req: request{"eow@openssh.com", nil}},
				{name: "auth-agent-req@openssh.com", req: request{"auth-agent-req@openssh.com", nil}, node: true},
				{name: "x11-req", req: request{"x11-req", ssh.Marshal(struct {
					Single        bool
					Proto, Cookie string
					Screen        uint32
				}{false, "MIT-MAGIC-COOKIE-1", "00", 0})}},
				{name: "keepalive@openssh.com", req: request{"keepalive@openssh.com", nil}},
				{name: "unknown", req: request{"unknown-request@example.com", nil}},
				{name: "empty name", req: request{"", nil}},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					want, end, exit := c.node, c.nodeEnd, c.nodeExit
					if isProxy {
						want, end, exit = c.proxy, c.proxyEnd, c.proxyExit
					}
					out := sendSession(t, m.clt, c.prep, c.req, end, c.input)
					require.Equal(t, want, out.ok, "reply to %q in %s mode", c.req.name, mode)
					if end {
						require.True(t, out.ended, "the server ends the session")
						require.Equal(t, exit, out.exit, "stderr: %q", out.stderr)
					}
					asked := m.askedProxy()
					if isProxy {
						if c.proxyStderr != "" {
							require.Contains(t, out.stderr, c.proxyStderr)
						}
						if c.proxyStdout != "" {
							require.Equal(t, c.proxyStdout, out.stdout)
						}
						if c.proxyAsked != "" {
							require.Equal(t, []string{c.proxyAsked}, asked)
						} else {
							require.Empty(t, asked, "only subsystems and direct-tcpip reach the ProxyHandler")
						}
					}
				})
			}

			t.Run("signal to a running command", func(t *testing.T) {
				// A node signals the process it runs; the proxy runs none.
				ch, exit := openSession(t, m.clt)
				defer ch.Close()
				ok, err := ch.SendRequest("exec", true, ssh.Marshal(execRequest{Command: "sleep 30"}))
				require.NoError(t, err)
				require.True(t, ok)
				if isProxy {
					require.Equal(t, 1, <-exit, "the proxy refused the command")
				}
				ok, err = ch.SendRequest("signal", true, ssh.Marshal(signalRequest{Signal: "KILL"}))
				if isProxy {
					// The session ended: the request fails or finds no
					// process.
					require.False(t, ok && err == nil)
					return
				}
				require.NoError(t, err)
				require.True(t, ok, "a node signals its process")
			})
		})
	}
}

func served[F any](m map[string]F) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
