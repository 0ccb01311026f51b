package reversetunnel

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// tapDialer dials like the agent's default and keeps the first bytes the
// agent writes on every connection after the first (its data
// connections): what an observer of the plain TCP path sees. fail makes
// those dials fail instead.
type tapDialer struct {
	fail  bool
	mu    sync.Mutex
	n     int
	heads [][]byte
}

func (d *tapDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.n++
	first := d.n == 1
	d.mu.Unlock()
	if !first && d.fail {
		return nil, &net.OpError{Op: "dial", Net: network, Err: io.ErrClosedPipe}
	}
	nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil || first {
		return nc, err
	}
	return &tapConn{Conn: nc, d: d}, nil
}

func (d *tapDialer) dataDials() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n - 1
}

type tapConn struct {
	net.Conn
	d    *tapDialer
	once sync.Once
}

func (c *tapConn) Write(p []byte) (int, error) {
	c.once.Do(func() {
		c.d.mu.Lock()
		c.d.heads = append(c.d.heads, bytes.Clone(p))
		c.d.mu.Unlock()
	})
	return c.Conn.Write(p)
}

func (f *fixture) startTapAgent(t *testing.T, uuid string, d *tapDialer, h ConnHandler, clock clockwork.Clock) *Agent {
	t.Helper()
	a, err := NewAgent(AgentConfig{
		ProxyAddr: f.addr,
		Signer:    f.ca.RoleHostSigner(t, srvtest.HostCert{UUID: uuid, Role: RoleNode}),
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{f.ca.Signer.PublicKey()} },
		Handler:   h,
		Dial:      d.dial,
		Deps:      observe.Deps{Clock: clock},
	})
	require.NoError(t, err)
	a.Start()
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, a.WaitConnected(ctx))
	waitTunnel(t, f.srv, uuid)
	return a
}

func echoOnce(t *testing.T, conn net.Conn, msg string) {
	t.Helper()
	_, err := conn.Write([]byte(msg))
	require.NoError(t, err)
	buf := make([]byte, len(msg))
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf))
}

// TestTransportOnDataConnection: a dial's bytes flow on a TCP connection
// of their own from the node (not inside the tunnel's SSH layer), with
// the transport's addresses; the tunnel's end ends it on both sides.
func TestTransportOnDataConnection(t *testing.T) {
	f := newFixture(t, nil)
	d := &tapDialer{}
	remotes := make(chan string, 1)
	var local atomic.Value
	a := f.startTapAgent(t, "node-1", d, func(nc net.Conn) {
		local.Store(nc.LocalAddr())
		echoHandler(remotes)(nc)
	}, nil)

	conn, err := f.srv.DialTunnel(context.Background(), "node-1", "203.0.113.7:5555", "web:22")
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "203.0.113.7:5555", <-remotes)
	require.Equal(t, 1, d.dataDials())
	require.IsType(t, &dataConn{}, conn)
	_, err = conn.(syscall.Conn).SyscallConn()
	require.NoError(t, err, "the splice can wait on the socket")
	require.IsType(t, &net.TCPAddr{}, local.Load(), "the node's end is its data connection's socket")
	echoOnce(t, conn, "ping")
	// Half-close: the node sees the end of what the proxy sends, and
	// what it sends back still arrives.
	_, err = conn.Write([]byte("half"))
	require.NoError(t, err)
	require.NoError(t, conn.(interface{ CloseWrite() error }).CloseWrite())
	rest, err := io.ReadAll(conn)
	require.NoError(t, err)
	require.Equal(t, "half", string(rest))
	require.Equal(t, 1.0, testutil.ToFloat64(f.srv.transports.WithLabelValues(pathDataConn)))
	require.Equal(t, 0.0, testutil.ToFloat64(f.srv.transports.WithLabelValues(pathInBand)))

	// The tunnel goes: the data connection goes with it.
	a.DropTunnel()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // fails once closed
	_, err = conn.Read(make([]byte, 1))
	// The node's hang-up, or this end closed by its lifeline first.
	require.True(t, errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed), "read after the tunnel went: %v", err)
}

// TestTransportInBandWhenNoDataConnection: a node that cannot dial the
// tunnel port again serves the transport inside the tunnel, and the dial
// works all the same; it stays in-band for dataConnRetry before it tries
// again.
func TestTransportInBandWhenNoDataConnection(t *testing.T) {
	f := newFixture(t, nil)
	d := &tapDialer{fail: true}
	remotes := make(chan string, 3)
	clock := clockwork.NewFakeClock()
	f.startTapAgent(t, "node-1", d, echoHandler(remotes), clock)

	dial := func(wantDataDials int) {
		t.Helper()
		conn, err := f.srv.DialTunnel(context.Background(), "node-1", "203.0.113.7:5555", "web:22")
		require.NoError(t, err)
		defer conn.Close()
		require.Equal(t, "203.0.113.7:5555", <-remotes)
		require.Equal(t, wantDataDials, d.dataDials())
		require.IsType(t, &channelConn{}, conn)
		echoOnce(t, conn, "pong")
	}
	dial(1)
	dial(1) // not tried again yet
	clock.Advance(dataConnRetry)
	dial(2)
	require.Equal(t, 3.0, testutil.ToFloat64(f.srv.transports.WithLabelValues(pathInBand)))
	require.Equal(t, 0.0, testutil.ToFloat64(f.srv.transports.WithLabelValues(pathDataConn)))
}

// dataConnAttempt is the attack: a raw TCP connection to the tunnel port
// presenting head. It returns what the port answered before hanging up.
func dataConnAttempt(t *testing.T, addr string, head []byte) []byte {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	_, err = nc.Write(head)
	require.NoError(t, err)
	require.NoError(t, nc.(*net.TCPConn).CloseWrite())
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err := io.ReadAll(nc)
	require.NoError(t, err)
	return got
}

// TestDataConnectionRefusals: a data connection is taken only with a
// token a waiting dial offered, once. A made-up token, a truncated one,
// and a token replayed by someone who saw a node's data connection go by
// (plain TCP) are refused and audited, and get no answer. The replay
// repeats the made-up token's refusal from the same address: it is counted
// into the window's summary (limiter.Denials), written here by Close.
func TestDataConnectionRefusals(t *testing.T) {
	f := newFixture(t, nil)
	d := &tapDialer{}
	f.startTapAgent(t, "node-1", d, echoHandler(make(chan string, 1)), nil)
	conn, err := f.srv.DialTunnel(context.Background(), "node-1", "203.0.113.7:5555", "web:22")
	require.NoError(t, err)
	defer conn.Close()
	d.mu.Lock()
	require.Len(t, d.heads, 1)
	seen := d.heads[0]
	d.mu.Unlock()
	require.True(t, strings.HasPrefix(string(seen), dataConnMagic))

	random := make([]byte, dataTokenSize)
	_, err = rand.Read(random)
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		head   []byte
		reason string
		repeat bool
	}{
		{"made-up token", append([]byte(dataConnMagic), random...), "token no dial is waiting for", false},
		{"replayed token", seen, "token no dial is waiting for", true},
		{"truncated token", []byte(dataConnMagic + "abc"), "without a token", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(f.audit.Events())
			// The port audits before it hangs up.
			require.Empty(t, dataConnAttempt(t, f.addr, tc.head))
			evs := f.audit.Events()[n:]
			if tc.repeat {
				require.Empty(t, evs, "a repeat waits for the summary")
				return
			}
			require.Len(t, evs, 1)
			require.Equal(t, events.AccessDenied, evs[0].Type)
			require.Equal(t, "tunnel", evs[0].Fields[events.FieldKind])
			require.Contains(t, evs[0].Fields[events.FieldReason], tc.reason)
		})
	}
	// The session that used the token is untouched.
	echoOnce(t, conn, "still")
	n := len(f.audit.Events())
	f.srv.denials.Close()
	evs := f.audit.Events()[n:]
	require.Len(t, evs, 1)
	require.Equal(t, 1, evs[0].Fields[events.FieldCount])
	require.Contains(t, evs[0].Fields[events.FieldReason], "refused 1 more time within 1m0s; the latest: data connection with a token no dial is waiting for")
}
