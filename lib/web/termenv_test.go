package web

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	oteltrace "go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/sessionapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// testNode is a real x/crypto SSH server standing in for a node: it
// checks user certificates against the auth server's user CA, presents a
// host certificate from its host CA, and runs a tiny "shell" that prints
// a prompt, echoes its input, reports window changes as "size=COLSxROWS",
// and exits with status 3 on "exit". It makes terminal tests exact
// without spawning processes.
type testNode struct {
	ln       net.Listener
	started  chan struct{} // one value per shell started
	signals  chan string   // one value per signal request
	envs     chan string   // NAME=VALUE per env request (while room)
	ended    chan struct{} // one value per session channel closed
	mu       sync.Mutex    // guards conns
	conns    map[ssh.Conn]struct{}
	wg       sync.WaitGroup
	accepted int // connections accepted; guarded by mu
	// room is a live session the node offers to join (sessions_join_test.go):
	// its id and the modes a join may ask for; guarded by mu.
	room      string
	roomModes []sessionapi.Mode
	// joinInput gets what a joined party's channel sent to the node.
	joinInput chan string
}

func newTestNode(t *testing.T, as *auth.Server, uuid, hostname string) *testNode {
	t.Helper()
	// A fresh in-memory host key, certified by the cluster's host CA.
	priv, pub, err := utils.GenerateKeyPair()
	require.NoError(t, err)
	certBytes, err := as.GenerateHostCert(context.Background(), auth.HostCertRequest{PublicKey: pub, UUID: uuid, Hostname: hostname, Principals: []string{"127.0.0.1"}, Role: auth.RoleNode})
	require.NoError(t, err)
	key, err := ssh.ParsePrivateKey(priv)
	require.NoError(t, err)
	certPub, _, _, _, err := ssh.ParseAuthorizedKey(certBytes)
	require.NoError(t, err)
	hostSigner, err := ssh.NewCertSigner(certPub.(*ssh.Certificate), key)
	require.NoError(t, err)

	var userCAs []ssh.PublicKey
	for _, line := range as.UserCAKeys() {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		require.NoError(t, err)
		userCAs = append(userCAs, k)
	}
	checker := &ssh.CertChecker{IsUserAuthority: func(k ssh.PublicKey) bool {
		for _, ca := range userCAs {
			if bytes.Equal(ca.Marshal(), k.Marshal()) {
				return true
			}
		}
		return false
	}}
	cfg := &ssh.ServerConfig{PublicKeyCallback: checker.Authenticate}
	cfg.AddHostKey(hostSigner)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	n := &testNode{ln: ln, started: make(chan struct{}, 16), signals: make(chan string, 16), envs: make(chan string, 16), ended: make(chan struct{}, 16), conns: map[ssh.Conn]struct{}{}, joinInput: make(chan string, 64)}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.mu.Lock()
			n.accepted++
			n.mu.Unlock()
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				n.serve(c, cfg)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		n.mu.Lock()
		for c := range n.conns {
			c.Close()
		}
		n.mu.Unlock()
		n.wg.Wait()
	})
	return n
}

func (n *testNode) addr() string { return n.ln.Addr().String() }

func (n *testNode) serve(c net.Conn, cfg *ssh.ServerConfig) {
	sconn, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		c.Close()
		return
	}
	n.mu.Lock()
	n.conns[sconn] = struct{}{}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.conns, sconn)
		n.mu.Unlock()
		sconn.Close()
	}()
	go ssh.DiscardRequests(reqs)
	var wg sync.WaitGroup
	defer wg.Wait()
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.session(ch, creqs)
		}()
	}
}

func (n *testNode) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer func() { n.ended <- struct{}{} }()
	defer ch.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	for req := range reqs {
		switch req.Type {
		case "pty-req":
			req.Reply(true, nil)
		case "env":
			var kv struct{ Name, Value string }
			if ssh.Unmarshal(req.Payload, &kv) == nil {
				select {
				case n.envs <- kv.Name + "=" + kv.Value:
				default:
				}
			}
			req.Reply(true, nil)
		case "window-change":
			if len(req.Payload) >= 8 {
				cols, rows := binary.BigEndian.Uint32(req.Payload), binary.BigEndian.Uint32(req.Payload[4:])
				fmt.Fprintf(ch, "size=%dx%d\r\n", cols, rows)
			}
		case "signal":
			// A hung-up shell exits, as bash does on SIGHUP.
			var sig struct{ Name string }
			_ = ssh.Unmarshal(req.Payload, &sig)
			n.signals <- sig.Name
			ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
				Signal     string
				CoreDumped bool
				Msg, Lang  string
			}{Signal: sig.Name}))
			ch.Close()
		case "subsystem":
			var sub struct{ Name string }
			_ = ssh.Unmarshal(req.Payload, &sub)
			if !n.subsystem(ch, req, sub.Name, &wg) {
				req.Reply(false, nil)
			}
		case "shell":
			req.Reply(true, nil)
			n.started <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.WriteString(ch, "prompt$ ")
				buf := make([]byte, 32<<10)
				for {
					k, err := ch.Read(buf)
					if err != nil {
						return
					}
					if bytes.Contains(buf[:k], []byte("flood")) {
						// More than the replay buffer, then a
						// full-screen program's screen.
						line := bytes.Repeat([]byte("x"), 1000)
						for i := 0; i < 2100; i++ {
							fmt.Fprintf(ch, "%04d %s\r\n", i, line)
						}
						io.WriteString(ch, "\x1b[?1049h\x1b[?1h\x1b[H\x1b[2JFULL SCREEN\x1b[3;5HEND-OF-FLOOD")
						continue
					}
					if bytes.Contains(buf[:k], []byte("exit")) {
						ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{3}))
						ch.Close()
						return
					}
					ch.Write(buf[:k])
				}
			}()
		default:
			req.Reply(false, nil)
		}
	}
}

// subsystem serves the node's shared-session subsystems for the room:
// "sessions" lists it, "join@ID/MODE" joins it when ID is the room and
// MODE one of roomModes (anything else is refused, as a node refuses a
// session the user may not join): the joined party sees the room's
// screen, then what it sends echoed as "got:...", recorded in joinInput.
func (n *testNode) subsystem(ch ssh.Channel, req *ssh.Request, name string, wg *sync.WaitGroup) bool {
	n.mu.Lock()
	room, modes := n.room, n.roomModes
	n.mu.Unlock()
	if name == sessionapi.ListSubsystem {
		req.Reply(true, nil)
		infos := []sessionapi.Info{}
		if room != "" {
			infos = append(infos, sessionapi.Info{ID: room, User: "bob", Login: "bob", Node: "node1", Participants: []string{"bob"}})
		}
		b, _ := json.Marshal(infos)
		ch.Write(b)
		ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
		ch.Close()
		return true
	}
	id, mode, err := sessionapi.ParseJoinRequest(name)
	if err != nil || room == "" || id != room || !slices.Contains(modes, mode) {
		return false
	}
	req.Reply(true, nil)
	wg.Add(1)
	go func() {
		defer wg.Done()
		fmt.Fprintf(ch, "ROOM SCREEN\r\n[postern: alice joined as %s]\r\n", mode)
		buf := make([]byte, 4096)
		for {
			k, err := ch.Read(buf)
			if err != nil {
				return
			}
			n.joinInput <- string(buf[:k])
			fmt.Fprintf(ch, "got:%s", buf[:k])
		}
	}()
	return true
}

// setRoom makes the node offer session id to joins in modes.
func (n *testNode) setRoom(id string, modes ...sessionapi.Mode) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.room, n.roomModes = id, modes
}

// termEnv is a whole web side: auth on a memory backend, a NodeWatcher, a
// Router, a test node, and the web server on 127.0.0.1.
type termEnv struct {
	clock  *clockwork.FakeClock
	auth   *auth.Server
	store  *services.Store
	server *Server
	node   *testNode
	url    string
	host   string
	http   *http.Client
	tls    *tls.Config
	// dialed records the raw connections the websocket client made.
	mu     sync.Mutex
	dialed []net.Conn
}

const (
	testUser     = "alice"
	testPassword = "correct horse battery"
	testNodeUUID = "0b8c8c6e-2d55-4f7c-9d4b-6a0c1f3b9a01"
)

func newTermEnv(t *testing.T, opts ...func(*WebSessionsConfig)) *termEnv {
	t.Helper()
	return newTracedTermEnv(t, nil, opts...)
}

// newTracedTermEnv is newTermEnv whose web server and Router start their
// spans with tracer (nil: tracing off).
func newTracedTermEnv(t *testing.T, tracer oteltrace.Tracer, opts ...func(*WebSessionsConfig)) *termEnv {
	t.Helper()
	ctx := context.Background()
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	bk, err := memory.New(memory.Config{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { bk.Close() })
	store := services.NewStore(bk)
	as, err := auth.NewServer(auth.ServerConfig{
		Store: store, ClusterName: "c1", BcryptCost: bcrypt.MinCost, Deps: observe.Deps{Clock: clock, Logger: quietLogger()},
		Limits: auth.LoginLimits{MaxFailures: 3, Window: time.Minute},
	})
	require.NoError(t, err)
	_, err = as.CreateUser(ctx, testUser, []byte(testPassword), []string{"alice", "deploy"}, nil, false)
	require.NoError(t, err)

	node := newTestNode(t, as, testNodeUUID, "node1")
	require.NoError(t, store.UpsertNode(ctx, services.Node{UUID: testNodeUUID, Hostname: "node1", Addr: node.addr(), Cluster: "c1", Labels: map[string]string{"env": "dev"}, Expires: clock.Now().Add(time.Hour), LastHeartbeat: clock.Now()}))

	nw, err := services.NewNodeWatcher(services.NodeWatcherConfig{Events: store.NodeEvents(), Clock: clock, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { nw.Close() })
	router, err := proxy.NewRouter(proxy.RouterConfig{ClusterName: "c1", NodeWatcher: nw, Networking: store, Deps: observe.Deps{Clock: clock, Logger: quietLogger(), Tracer: tracer}})
	require.NoError(t, err)

	pair, err := LoadOrCreateTLS(t.TempDir(), "", "", nil, time.Now())
	require.NoError(t, err)
	wsc := WebSessionsConfig{Router: router, Nodes: nw, Roles: store, Store: &BackendSessionStore{Backend: bk}}
	for _, o := range opts {
		o(&wsc)
	}
	s, err := NewServer(Config{
		ClusterName: "c1", ProxySSHAddr: "127.0.0.1:3023", Certificate: pair, Auth: as,
		WebSessions: wsc,
		Deps:        observe.Deps{Clock: clock, Logger: quietLogger(), Tracer: tracer},
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()

	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	e := &termEnv{clock: clock, auth: as, store: store, server: s, node: node, host: ln.Addr().String(), url: "https://" + ln.Addr().String(), tls: &tls.Config{RootCAs: pool}}
	tr := &http.Transport{TLSClientConfig: e.tls}
	e.http = &http.Client{Transport: tr}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		require.NoError(t, s.Shutdown(context.Background()))
		require.NoError(t, <-done)
	})
	return e
}

// webSession is a logged-in browser: its cookie and bearer token.
type webSession struct {
	cookie *http.Cookie
	token  string
}

func (e *termEnv) login(t *testing.T) webSession {
	t.Helper()
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":%q,"password":%q,"otp_token":""}`, testUser, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	var ws webSession
	for _, c := range resp.Cookies() {
		if c.Name == SessionCookieName {
			ws.cookie = c
		}
	}
	require.NotNil(t, ws.cookie)
	ws.token = out.Token
	return ws
}

func (e *termEnv) do(t *testing.T, method, path, body string, ws webSession, hdr http.Header) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header[k] = v
	}
	if ws.cookie != nil {
		req.AddCookie(&http.Cookie{Name: SessionCookieName, Value: ws.cookie.Value})
	}
	if ws.token != "" {
		req.Header.Set("Authorization", "Bearer "+ws.token)
	}
	resp, err := e.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, data
}

// dialTerminal opens the terminal websocket with the session's cookie
// (when set); the caller sends the first message.
func (e *termEnv) dialTerminal(t *testing.T, ctx context.Context, ws webSession, params TerminalParams) *websocket.Conn {
	t.Helper()
	p, err := json.Marshal(params)
	require.NoError(t, err)
	return e.dialSocket(t, ctx, ws, "/webapi/terminal?params="+url.QueryEscape(string(p)))
}

// dialSocket opens a terminal-protocol websocket at path (the terminal,
// a joined session) with the session's cookie (when set).
func (e *termEnv) dialSocket(t *testing.T, ctx context.Context, ws webSession, path string) *websocket.Conn {
	t.Helper()
	hdr := http.Header{}
	if ws.cookie != nil {
		hdr.Set("Cookie", SessionCookieName+"="+ws.cookie.Value)
	}
	tr := &http.Transport{DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&tls.Dialer{Config: e.tls}).DialContext(ctx, network, addr)
		if err == nil {
			e.mu.Lock()
			e.dialed = append(e.dialed, c)
			e.mu.Unlock()
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	c, _, err := websocket.Dial(ctx, "wss://"+e.host+path, &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: tr}, HTTPHeader: hdr, Subprotocols: []string{TerminalSubprotocol},
	})
	require.NoError(t, err)
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// openTerminal logs the socket in and waits for {"status":"ok"}.
func openTerminal(t *testing.T, ctx context.Context, c *websocket.Conn, token string) {
	t.Helper()
	require.NoError(t, c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"token":%q}`, token))))
	typ, msg, err := c.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, websocket.MessageText, typ)
	require.JSONEq(t, `{"status":"ok"}`, string(msg))
}

// readUntil reads frames until one of type typ contains want, collecting
// terminal output; it fails on a close.
func readUntil(t *testing.T, ctx context.Context, c *websocket.Conn, typ byte, want string) Frame {
	t.Helper()
	var seen bytes.Buffer
	for {
		_, msg, err := c.Read(ctx)
		require.NoError(t, err, "waiting for %c %q; saw %q", typ, want, seen.String())
		f, err := DecodeFrame(msg)
		require.NoError(t, err)
		if f.Type == FrameData {
			seen.Write(f.Payload)
			if typ == FrameData && strings.Contains(seen.String(), want) {
				return Frame{Type: FrameData, Payload: seen.Bytes()}
			}
			continue
		}
		if f.Type == typ && strings.Contains(string(f.Payload), want) {
			return f
		}
	}
}

// requireClosed reads until the socket closes and checks the status and
// reason.
func requireClosed(t *testing.T, ctx context.Context, c *websocket.Conn, code websocket.StatusCode, reason string) {
	t.Helper()
	for {
		_, _, err := c.Read(ctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		require.ErrorAs(t, err, &ce, "expected a close frame")
		require.Equal(t, code, ce.Code, ce.Reason)
		require.Contains(t, ce.Reason, reason)
		return
	}
}
