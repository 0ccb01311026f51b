package web

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// TestTerminalRoutesAmongVisibleNodes: the web terminal filters by the
// user's access before routing, like the SSH port: a second "node1" the
// user may not see neither makes the name ambiguous nor shows up.
func TestTerminalRoutesAmongVisibleNodes(t *testing.T) {
	e := newTermEnv(t)
	ctx := context.Background()
	const hiddenUUID = "2d0e8e80-4f77-4b9e-9f6d-8c2e3b5dbc03"
	hidden := newTestNode(t, e.auth, hiddenUUID, "node1")
	require.NoError(t, e.store.UpsertNode(ctx, services.Node{UUID: hiddenUUID, Hostname: "node1", Addr: hidden.addr(), Cluster: "c1",
		Labels: map[string]string{"env": "prod"}, Expires: e.clock.Now().Add(time.Hour), LastHeartbeat: e.clock.Now().Add(time.Minute)}))
	require.NoError(t, e.store.UpsertRole(ctx, &services.Role{Kind: "role", Metadata: services.Metadata{Name: "dev-only"}, Spec: services.RoleSpec{
		Logins: []string{"{{internal.logins}}"}, NodeLabels: map[string]services.LabelValues{"env": {"dev"}},
	}}))
	_, err := e.auth.CreateUser(ctx, "bob", []byte(testPassword), []string{"bob"}, []string{"dev-only"}, false)
	require.NoError(t, err)
	resp, body := e.do(t, http.MethodPost, "/webapi/sessions", fmt.Sprintf(`{"user":"bob","password":%q,"otp_token":""}`, testPassword), webSession{}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var out webapi.CreateSessionResponse
	require.NoError(t, json.Unmarshal(body, &out))
	ws := webSession{cookie: resp.Cookies()[0], token: out.Token}

	// Once the watcher has the hidden node, the admin sees an ambiguous
	// name; bob's terminal still opens on the node he may reach, under
	// both strategies (the hidden one has the later heartbeat).
	waitNodes(t, e, 2)
	for _, strat := range []string{services.RoutingUnambiguousMatch, services.RoutingMostRecent} {
		require.NoError(t, e.store.SetClusterNetworkingConfig(ctx, &services.ClusterNetworkingConfig{Spec: services.ClusterNetworkingConfigSpec{RoutingStrategy: strat}}))
		tctx := testCtx(t)
		c := e.dialTerminal(t, tctx, ws, TerminalParams{Host: "node1", Login: "bob", Cols: 80, Rows: 24})
		openTerminal(t, tctx, c, ws.token)
		readUntil(t, tctx, c, FrameData, "prompt$ ")
		<-e.node.started
		c.CloseNow()
	}
	hidden.mu.Lock()
	defer hidden.mu.Unlock()
	require.Zero(t, hidden.accepted, "the hidden node must not be dialed")
}

// waitNodes waits for the router's watcher (fed asynchronously by the
// backend watch) to hold n nodes.
func waitNodes(t *testing.T, e *termEnv, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		nodes, err := e.server.cfg.WebSessions.Nodes.GetNodes(context.Background(), "c1")
		return err == nil && len(nodes) == n
	}, testTimeout, 10*time.Millisecond)
}

// frozenRelay forwards TCP to target until frozen; then it forwards
// nothing more either way and keeps the connections open: a node that
// froze after the handshake (SIGSTOP, a paused VM).
type frozenRelay struct {
	ln     net.Listener
	frozen chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex // guards conns
	conns  []net.Conn
}

func newFrozenRelay(t *testing.T, target string) *frozenRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &frozenRelay{ln: ln, frozen: make(chan struct{})}
	r.wg.Go(func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, a, b)
			r.mu.Unlock()
			r.wg.Go(func() { r.pipe(b, a) })
			r.wg.Go(func() { r.pipe(a, b) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		r.freeze()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *frozenRelay) freeze() { r.once.Do(func() { close(r.frozen) }) }

func (r *frozenRelay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-r.frozen:
			io.Copy(io.Discard, src)
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestTerminalFrozenNode: a node that freezes under an open web terminal
// ends it, within the keep-alive bound, with a message saying so. The
// intervals are short and real (configured through WebSessionsConfig).
func TestTerminalFrozenNode(t *testing.T) {
	const interval = 100 * time.Millisecond
	e := newTermEnv(t, func(c *WebSessionsConfig) {
		c.NodeKeepAlive = utils.SSHKeepAliveConfig{Interval: interval, CountMax: 3, Clock: clockwork.NewRealClock()}
	})
	relay := newFrozenRelay(t, e.node.addr())
	ctx := context.Background()
	require.NoError(t, e.store.UpsertNode(ctx, services.Node{UUID: testNodeUUID, Hostname: "node1", Addr: relay.ln.Addr().String(), Cluster: "c1",
		Labels: map[string]string{"env": "dev"}, Expires: e.clock.Now().Add(time.Hour), LastHeartbeat: e.clock.Now()}))
	require.Eventually(t, func() bool {
		nodes, err := e.server.cfg.WebSessions.Nodes.GetNodes(ctx, "c1")
		return err == nil && len(nodes) == 1 && nodes[0].Addr == relay.ln.Addr().String()
	}, testTimeout, 10*time.Millisecond)

	ws := e.login(t)
	tctx := testCtx(t)
	c := e.dialTerminal(t, tctx, ws, defaultParams())
	openTerminal(t, tctx, c, ws.token)
	readUntil(t, tctx, c, FrameData, "prompt$ ")
	<-e.node.started

	relay.freeze()
	start := time.Now()
	f := readUntil(t, tctx, c, FrameError, "")
	require.Equal(t, `connection to node "node1" lost: no answer to keep-alives for 300ms`, string(f.Payload))
	require.Less(t, time.Since(start), 30*interval, "noticed too late")
	requireClosed(t, tctx, c, closeError, "no answer to keep-alives")
}
