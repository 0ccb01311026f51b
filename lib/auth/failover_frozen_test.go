package auth

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// freezer is a TCP relay in front of a real auth API server that can be
// frozen the way a SIGSTOPped process is: the kernel still completes TCP
// handshakes (the relay's listener stays open, its backlog fills), and
// bytes sent on open connections are taken in, but nothing is accepted and
// nothing comes back until it thaws.
type freezer struct {
	l      net.Listener
	target string
	// accepted counts connections the relay accepted (while thawed).
	accepted atomic.Int64

	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	l, err := netListen()
	require.NoError(t, err)
	f := &freezer{l: l, target: target}
	f.cond = sync.NewCond(&f.mu)
	f.wg.Add(1)
	go f.acceptLoop()
	t.Cleanup(f.close)
	return f
}

func (f *freezer) addr() string { return f.l.Addr().String() }

func (f *freezer) freeze() { f.set(true) }
func (f *freezer) thaw()   { f.set(false) }

func (f *freezer) set(frozen bool) {
	f.mu.Lock()
	f.frozen = frozen
	f.cond.Broadcast()
	f.mu.Unlock()
}

// gate waits while frozen; false once closed.
func (f *freezer) gate() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.frozen && !f.closed {
		f.cond.Wait()
	}
	return !f.closed
}

func (f *freezer) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		return false
	}
	f.conns = append(f.conns, c)
	return true
}

func (f *freezer) acceptLoop() {
	defer f.wg.Done()
	for f.gate() {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		f.accepted.Add(1)
		up, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		if !f.track(c) || !f.track(up) {
			c.Close()
			up.Close()
			return
		}
		f.wg.Add(2)
		go f.pipe(up, c)
		go f.pipe(c, up)
	}
}

// pipe copies src to dst, holding every chunk while frozen.
func (f *freezer) pipe(dst, src net.Conn) {
	defer f.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !f.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// close ends the relay and waits for its goroutines; idempotent.
func (f *freezer) close() {
	f.mu.Lock()
	f.closed = true
	f.cond.Broadcast()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	f.l.Close()
	for _, c := range conns {
		c.Close()
	}
	f.wg.Wait()
}

// frozenListener is a listener nobody accepts on: what a SIGSTOPped auth
// server's port looks like from the start (TCP connects, TLS never
// answers). serve "resumes" it: a real API server takes it over, backlog
// and all.
func frozenListener(t *testing.T) net.Listener {
	t.Helper()
	l, err := netListen()
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

// serveOn serves env's auth API on l until the test ends.
func serveOn(t *testing.T, env *testEnv, l net.Listener) *APIServer {
	t.Helper()
	api, err := NewAPIServer(APIConfig{Auth: env.auth, Listener: l, Deps: observe.Deps{Logger: testLogger()}})
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- api.Serve() }()
	t.Cleanup(func() {
		api.Close()
		require.NoError(t, <-served)
	})
	return api
}

// awaitFailback makes calls until the background probe has taken the
// client back to its preferred server.
func awaitFailback(t *testing.T, clt *Client) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := clt.Ping(context.Background())
		require.NoError(t, err)
		return clt.servers.current() == 0
	}, 10*time.Second, 10*time.Millisecond, "the client fails back to the preferred server")
}

// TestClientFailoverFrozenAtDial is the SIGSTOPped auth server of issue
// item 5, met when connecting: the first address's port completes TCP
// handshakes but never answers TLS. The first call reaches the second
// server within the dial timeout (not the 30 s call timeout), the next
// ones go there directly; once the first server answers again the client
// does not move before failbackInterval (fake clock), and moves back
// after it.
func TestClientFailoverFrozenAtDial(t *testing.T) {
	env := newTestAuth(t)
	frozen := frozenListener(t)
	startAPI(t, env)
	live := env.addr

	id, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	const dialTimeout = 300 * time.Millisecond
	clt, err := NewClient(ClientConfig{
		Addr: frozen.Addr().String() + "," + live, Identity: id, Deps: observe.Deps{Clock: env.clock},
		DialTimeout: dialTimeout, // the call timeout stays DefaultClientTimeout
	})
	require.NoError(t, err)
	defer clt.Close()
	ctx := context.Background()

	start := time.Now()
	_, err = clt.Ping(ctx)
	require.NoError(t, err)
	require.Less(t, time.Since(start), dialTimeout+2*time.Second, "skipped at dial, not after the call timeout")
	require.Equal(t, 1, clt.servers.current())

	// The next calls do not try the frozen server again.
	start = time.Now()
	for range 5 {
		_, err = clt.GetUsers(ctx)
		require.NoError(t, err)
	}
	require.Less(t, time.Since(start), dialTimeout, "no call waits on the frozen server twice")

	// The frozen server resumes: its listener starts being served.
	serveOn(t, env, frozen)
	_, err = clt.Ping(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, clt.servers.current(), "no fail-back before the interval")

	env.clock.Advance(failbackInterval)
	awaitFailback(t, clt)
	_, err = clt.GetUsers(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, clt.servers.current())
}

// TestClientFailoverFrozenMidCall is the same auth server freezing while
// the client holds kept-alive connections to it (the node of item 5 whose
// heartbeats failed with "context deadline exceeded"): the heartbeat in
// flight waits out the call timeout once, then goes to the other server
// and succeeds; every later call goes there at once. A still frozen
// preferred server costs no call anything at the fail-back probe; when it
// thaws the client returns to it.
func TestClientFailoverFrozenMidCall(t *testing.T) {
	env := newTestAuth(t)
	startAPI(t, env)
	f := newFreezer(t, env.addr)
	startAPI(t, env)
	other := env.addr

	node := env.newHostNode(t, "node1", RoleNode)
	const callTimeout = time.Second
	clt, err := NewClient(ClientConfig{
		Addr: f.addr() + "," + other, Identity: node.id, Deps: observe.Deps{Clock: env.clock},
		Timeout: callTimeout, DialTimeout: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	defer clt.Close()
	ctx := context.Background()
	beat := func() error {
		now := env.clock.Now()
		return clt.UpsertNode(ctx, services.Node{UUID: "node1", Hostname: "node1", Addr: node.addr, LastHeartbeat: now, Expires: now.Add(time.Minute)})
	}
	require.NoError(t, beat())
	require.Equal(t, 0, clt.servers.current())

	f.freeze()
	start := time.Now()
	require.NoError(t, beat(), "the heartbeat is sent again to the other server")
	took := time.Since(start)
	require.GreaterOrEqual(t, took, callTimeout, "it waited on the frozen server's connection")
	require.Less(t, took, 2*callTimeout, "but only once")
	require.Equal(t, 1, clt.servers.current())

	start = time.Now()
	for range 5 {
		require.NoError(t, beat())
		_, err := clt.PingDetails(ctx)
		require.NoError(t, err)
	}
	require.Less(t, time.Since(start), callTimeout, "no call waits on the frozen server again")

	// A probe while it is still frozen fails in the background; calls
	// carry on at the other server without waiting.
	env.clock.Advance(failbackInterval)
	start = time.Now()
	require.NoError(t, beat())
	require.Less(t, time.Since(start), callTimeout)
	require.Eventually(t, func() bool {
		clt.servers.mu.Lock()
		defer clt.servers.mu.Unlock()
		return !clt.servers.probing
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, clt.servers.current())

	f.thaw()
	acceptedBefore := f.accepted.Load()
	env.clock.Advance(failbackInterval)
	awaitFailback(t, clt)
	require.NoError(t, beat())
	require.Greater(t, f.accepted.Load(), acceptedBefore, "calls reach the preferred server again")
}

// TestClientFailoverNotRepeated: a call that is not safe to send twice (a
// POST) is not sent again when its server freezes with it in flight; it
// fails with a connection problem after one call timeout, and the next
// call goes to the other server.
func TestClientFailoverNotRepeated(t *testing.T) {
	env := newTestAuth(t)
	startAPI(t, env)
	f := newFreezer(t, env.addr)
	startAPI(t, env)
	id, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	clt, err := NewClient(ClientConfig{
		Addr: f.addr() + "," + env.addr, Identity: id, Deps: observe.Deps{Clock: env.clock},
		Timeout: 500 * time.Millisecond, DialTimeout: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	defer clt.Close()
	ctx := context.Background()
	_, err = clt.GetTokens(ctx)
	require.NoError(t, err)

	f.freeze()
	_, err = clt.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "deadline") || errors.Is(err, context.DeadlineExceeded), "%v", err)
	tok, err := clt.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	require.NoError(t, err)
	require.NotEmpty(t, tok.Name)
	f.thaw()
}

// TestClientFailoverCallerDeadline: a heartbeat runs under its own
// deadline (the interval, 10 s) shorter than the call timeout (30 s). With
// the server frozen under kept-alive connections, the heartbeat still
// lands on the other server within its deadline; a call that cannot be
// repeated fails at its deadline but moves the next calls all the same
// (before, every heartbeat took the next pooled connection to the frozen
// server, hit its own deadline first, and the node never failed over).
func TestClientFailoverCallerDeadline(t *testing.T) {
	env := newTestAuth(t)
	startAPI(t, env)
	f := newFreezer(t, env.addr)
	startAPI(t, env)
	node := env.newHostNode(t, "node1", RoleNode)
	clt, err := NewClient(ClientConfig{Addr: f.addr() + "," + env.addr, Identity: node.id, Deps: observe.Deps{Clock: env.clock}})
	require.NoError(t, err)
	defer clt.Close()
	const interval = time.Second
	beat := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		defer cancel()
		now := env.clock.Now()
		return clt.UpsertNode(ctx, services.Node{UUID: "node1", Hostname: "node1", Addr: node.addr, LastHeartbeat: now, Expires: now.Add(time.Minute)})
	}
	require.NoError(t, beat())
	// Several connections in the pool, as a busy node has.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := clt.PingDetails(context.Background())
			require.NoError(t, err)
		}()
	}
	wg.Wait()

	f.freeze()
	require.NoError(t, beat(), "the heartbeat reaches the other server within its own deadline")
	require.Equal(t, 1, clt.servers.current())
	for range 3 {
		require.NoError(t, beat())
	}

	// Back to the first server, then a call that is not repeated.
	f.thaw()
	env.clock.Advance(failbackInterval)
	awaitFailback(t, clt)
	admin, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	aclt, err := NewClient(ClientConfig{Addr: f.addr() + "," + env.addr, Identity: admin, Deps: observe.Deps{Clock: env.clock}})
	require.NoError(t, err)
	defer aclt.Close()
	_, err = aclt.GetTokens(context.Background())
	require.NoError(t, err)
	f.freeze()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err = aclt.CreateToken(ctx, services.TokenTypeNode, time.Hour)
	cancel()
	require.Error(t, err)
	require.Equal(t, 1, aclt.servers.current(), "its deadline passing marks the frozen server")
	_, err = aclt.CreateToken(context.Background(), services.TokenTypeNode, time.Hour)
	require.NoError(t, err)
	f.thaw()
}

// TestAPIShutdownLosesNoCalls is item 6: one of two auth API servers is
// shut down gracefully while clients call in a loop (reads, heartbeats,
// and a PUT that replaces a record); not one call fails: calls in flight
// finish there, and the ones that meet a closed or closing connection
// are sent to the other server.
func TestAPIShutdownLosesNoCalls(t *testing.T) {
	env := newTestAuth(t)
	api1 := startAPI(t, env)
	addr1 := env.addr
	startAPI(t, env)
	addr2 := env.addr
	node := env.newHostNode(t, "node1", RoleNode)
	admin, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	newClient := func(id *Identity) *Client {
		clt, err := NewClient(ClientConfig{Addr: addr1 + "," + addr2, Identity: id, Deps: observe.Deps{Clock: env.clock}, Timeout: 10 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { clt.Close() })
		return clt
	}
	ctx := context.Background()

	var calls, failures atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	loop := func(call func() error) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := call(); err != nil {
				failures.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			calls.Add(1)
		}
	}
	nodeClt := newClient(node.id)
	adminClt := newClient(admin)
	wg.Add(4)
	go loop(func() error {
		now := env.clock.Now()
		return nodeClt.UpsertNode(ctx, services.Node{UUID: "node1", Hostname: "node1", Addr: node.addr, LastHeartbeat: now, Expires: now.Add(time.Minute)})
	})
	proxyClt := newClient(env.identity(t, "proxy1", RoleProxy))
	go loop(func() error { _, err := proxyClt.GetNodes(ctx, ""); return err })
	go loop(func() error { _, err := adminClt.GetUsers(ctx); return err })
	go loop(func() error {
		return adminClt.UpsertRole(ctx, &services.Role{Metadata: services.Metadata{Name: "loop"}, Spec: services.RoleSpec{Logins: []string{"x"}}})
	})

	awaitCalls := func(n int64) {
		t.Helper()
		target := calls.Load() + n
		require.Eventually(t, func() bool { return calls.Load() >= target }, 30*time.Second, 5*time.Millisecond)
	}
	awaitCalls(100)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	require.NoError(t, api1.Shutdown(sctx))
	cancel()
	awaitCalls(200)
	close(stop)
	wg.Wait()
	require.Zero(t, failures.Load(), "of %d calls; the first failure: %v", calls.Load(), firstErr.Load())
	require.Equal(t, 1, nodeClt.servers.current())
	require.Equal(t, 1, adminClt.servers.current())
}

// TestDialRelaySkipsAFrozenServer: what a proxy relays for a tunnel node
// (whose TLS it cannot see) goes to a server that completes a handshake
// with the proxy's own identity, never to a frozen one listed first; the
// frozen one is marked suspect for the proxy's own calls too. The relayed
// connection then carries a real mutual-TLS call of its own.
func TestDialRelaySkipsAFrozenServer(t *testing.T) {
	env := newTestAuth(t)
	frozen := frozenListener(t)
	startAPI(t, env)

	id, err := ReadIdentity(env.adminDir)
	require.NoError(t, err)
	const dialTimeout = 300 * time.Millisecond
	clt, err := NewClient(ClientConfig{Addr: frozen.Addr().String() + "," + env.addr, Identity: id, Deps: observe.Deps{Clock: env.clock}, DialTimeout: dialTimeout})
	require.NoError(t, err)
	defer clt.Close()
	require.Equal(t, 0, clt.servers.current())

	ctx := context.Background()
	start := time.Now()
	conn, err := clt.DialRelay(ctx)
	require.NoError(t, err)
	require.Less(t, time.Since(start), dialTimeout+2*time.Second)
	require.Equal(t, env.addr, conn.RemoteAddr().String())
	require.Equal(t, 1, clt.servers.current(), "the proxy's own calls move off the frozen server too")

	// A host behind the relay speaks its own TLS on the connection.
	relayed, err := NewClient(ClientConfig{
		Addr: env.addr, Identity: id, Deps: observe.Deps{Clock: env.clock},
		Dial: func(context.Context, string, string) (net.Conn, error) {
			if c := conn; c != nil {
				conn = nil
				return c, nil
			}
			return nil, errors.New("one relayed connection only")
		},
	})
	require.NoError(t, err)
	defer relayed.Close()
	_, err = relayed.Ping(ctx)
	require.NoError(t, err)

	_, err = relayed.DialRelay(ctx)
	require.Error(t, err, "a client that dials through a relay relays nothing")
}
