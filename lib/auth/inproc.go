package auth

import (
	"context"
	"net"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/sirupsen/logrus"
)

// In-process clients. The node and proxy roles of a process that also runs
// auth talk to it through the same Client, over the same API handlers and
// the same role table (registerRoutes), as they would from another
// machine: a connection made in memory and served by this APIServer's
// http.Server with its mutual TLS. One path means one set of checks (an
// all-in-one node's heartbeat is dated and its address proven like any
// other), one set of tests, and no per-feature adapter choosing between the
// Store and the API (every "auth is here" branch was a place where the two
// could drift apart: the second-factor hint did).
//
// Why a socket pair (Linux) and not net.Pipe: a pipe has no buffer, so
// TLS's close alerts and HTTP's pipelined writes block until the far side
// reads; the kernel's buffer behaves like the TCP connection the rest of
// the code assumes, and recordings stream through it at memory speed.

// inProcessPeerAddr is the remote address the API sees for an in-process
// caller: this machine, which is what it is. The address checks of
// AnnounceNode treat a loopback source as "the node's addresses are this
// machine's own", exactly as for a node on this host dialing 127.0.0.1.
var inProcessPeerAddr net.Addr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}

// inProcessConn gives an in-memory stream the addresses of a local TCP
// connection (HTTP, audit and the address checks read them).
type inProcessConn struct {
	net.Conn
	local, remote net.Addr
}

func (c *inProcessConn) LocalAddr() net.Addr  { return c.local }
func (c *inProcessConn) RemoteAddr() net.Addr { return c.remote }

// DialInProcess opens a connection to this API server in memory; the caller
// runs its mutual TLS over it as over TCP. It fails once the server is
// closing.
func (a *APIServer) DialInProcess(ctx context.Context) (net.Conn, error) {
	client, server, err := streamPair()
	if err != nil {
		return nil, trace.Wrap(err)
	}
	sc := &inProcessConn{Conn: server, local: a.Addr(), remote: inProcessPeerAddr}
	if !a.localLn.pushContext(ctx, sc) {
		_ = client.Close()
		if err := ctx.Err(); err != nil {
			return nil, trace.ConnectionProblem(err, "in-process auth API: %v", err)
		}
		return nil, trace.ConnectionProblem(nil, "in-process auth API is shutting down")
	}
	return &inProcessConn{Conn: client, local: inProcessPeerAddr, remote: a.Addr()}, nil
}

// NewInProcessClient is a Client of this API server for identity id (a
// host role of this process), connected in memory.
func (a *APIServer) NewInProcessClient(id *Identity, clock clockwork.Clock, log logrus.FieldLogger) (*Client, error) {
	clt, err := NewClient(ClientConfig{
		// Names the API in messages and URLs; nothing dials it.
		Addr:     a.Addr().String(),
		Identity: id,
		Deps:     observe.Deps{Clock: clock, Logger: log},
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return a.DialInProcess(ctx)
		},
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	// What a proxy relays to auth (tunnel nodes' calls, joins) goes in
	// memory too: raw bytes, the far host's own TLS inside.
	clt.relay = a.DialInProcess
	return clt, nil
}
