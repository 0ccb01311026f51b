package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/services"
)

// countingListener counts the bytes its accepted connections read: what
// the proxy sent to the service behind it.
type countingListener struct {
	net.Listener
	read atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &l.read}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// rawServer accepts connections, writes greeting to each (if any) and then
// reads (counting) until the peer goes away.
func rawServer(t *testing.T, greeting string) *countingListener {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := &countingListener{Listener: inner}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if greeting != "" {
					c.Write([]byte(greeting))
				}
				io.Copy(io.Discard, c)
			})
		}
	})
	return ln
}

// TestDialHostRefusesNonSSH is the attack of issue 10 item 4: a node record
// whose addr points at a service that is not an SSH server (the auth API,
// the web port, anything internal). The proxy must refuse to relay, and
// no byte of the client may reach the service.
func TestDialHostRefusesNonSSH(t *testing.T) {
	httpLn := &countingListener{Listener: mustListen(t)}
	httpSrv := &http.Server{Handler: http.NotFoundHandler()}
	go httpSrv.Serve(httpLn)
	t.Cleanup(func() { httpSrv.Close() })

	tlsInner := mustListen(t)
	tlsLn := &countingListener{Listener: tlsInner}
	tlsSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsSrv.Listener.Close()
	tlsSrv.Listener = tlsLn
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)

	silent := rawServer(t, "")
	smtp := rawServer(t, "220 mail.internal ESMTP ready\r\n")
	long := rawServer(t, "SSH-2.0-"+strings.Repeat("x", 400))
	httpFirst := rawServer(t, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

	env := newRouterEnv(t, []services.Node{
		node("h", "http", httpLn.Addr().String(), 0),
		node("t", "tls", tlsLn.Addr().String(), 0),
		node("s", "silent", silent.Addr().String(), 0),
		node("m", "smtp", smtp.Addr().String(), 0),
		node("l", "long", long.Addr().String(), 0),
		node("f", "httpfirst", httpFirst.Addr().String(), 0),
	}, nil)
	env.setNetworking(t, services.RoutingUnambiguousMatch, false, 300*time.Millisecond)

	for _, c := range []struct {
		host string
		ln   *countingListener
	}{
		{"http", httpLn}, {"tls", tlsLn}, {"silent", silent}, {"smtp", smtp}, {"long", long}, {"httpfirst", httpFirst},
	} {
		t.Run(c.host, func(t *testing.T) {
			start := time.Now()
			conn, route, err := env.router.DialHost(context.Background(), RouteRequest{Target: Target{Host: c.host}})
			require.Nil(t, conn)
			require.True(t, trace.IsConnectionProblem(err), "%T %v", err, err)
			require.Equal(t, `node "`+c.host+`" (`+route.Node.Addr+`) did not answer as an SSH server`, err.Error())
			require.Less(t, time.Since(start), 5*time.Second)
			require.Zero(t, c.ln.read.Load(), "client bytes reached the service")
		})
	}
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

// TestDialHostReplaysBanner: an SSH server that sends its identification
// and more in one segment is relayed byte for byte, and the client's
// bytes reach it.
func TestDialHostReplaysBanner(t *testing.T) {
	const hello = "SSH-2.0-OpenSSH_9.2\r\n\x00\x00\x01\x0ckexinit..."
	ln := mustListen(t)
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- ""
			return
		}
		defer c.Close()
		c.Write([]byte(hello))
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	env := newRouterEnv(t, []services.Node{node("n", "n", ln.Addr().String(), 0)}, nil)
	conn, _, err := env.router.DialHost(context.Background(), RouteRequest{Target: Target{Host: "n"}})
	require.NoError(t, err)
	buf := make([]byte, len(hello))
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.Equal(t, hello, string(buf))
	_, err = conn.Write([]byte("SSH-2.0-client\r\n"))
	require.NoError(t, err)
	require.NoError(t, conn.(interface{ CloseWrite() error }).CloseWrite())
	require.Equal(t, "SSH-2.0-client\r\n", <-got)
	conn.Close()

	// SSH-1.99 (a server that speaks 1.x and 2.0) is an SSH server too.
	c1, c2 := net.Pipe()
	go c2.Write([]byte("SSH-1.99-old\r\n"))
	rc, err := checkBanner(context.Background(), c1, time.Second)
	require.NoError(t, err)
	b := make([]byte, 14)
	_, err = io.ReadFull(rc, b)
	require.NoError(t, err)
	require.Equal(t, "SSH-1.99-old\r\n", string(b))
	c1.Close()
	c2.Close()
}
