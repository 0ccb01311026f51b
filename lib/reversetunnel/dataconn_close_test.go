package reversetunnel

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/limiter"
	"github.com/postern-dev/postern/lib/utils"
)

// TestDataConnEndsParkedSplice: a data connection whose tunnel ends while
// the proxy's splice of it has gone quiet (an idle `ssh -J` to a node
// that was then stopped: its kernel keeps the socket open and sends
// nothing) ends that splice, and so closes the client's side, at once.
// The node end here never reads or closes, like a SIGSTOPped process.
// The connection comes through the tunnel port's limiter, as it does in a
// proxy: its socket is found under the wrapper, and the quiet direction
// parks.
func TestDataConnEndsParkedSplice(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	// The tunnel port's listener as the proxy wraps it: the accepted
	// connection is the limiter's, which hides the socket but unwraps.
	lim, err := limiter.NewConnectionLimiter(limiter.Config{Name: "tunnel"})
	require.NoError(t, err)
	ln := limiter.WrapListener(raw, lim, limiter.ListenerOptions{})
	defer ln.Close()
	node, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer node.Close()
	nc, err := ln.Accept()
	require.NoError(t, err)

	tunnelDone := make(chan struct{})
	dc := newDataConn(nc, tunnelDone, chanAddr("proxy"), chanAddr("tunnel:node-1"))
	// The client's channel: no socket, so the direction that reads the
	// data connection is the one that parks.
	client, proxySide := net.Pipe()
	defer client.Close()
	spliced := make(chan struct{})
	go func() {
		defer close(spliced)
		_, _, _ = utils.Splice(context.Background(), proxySide, dc)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, utils.WaitParkedSplices(ctx, 1), "the quiet direction parks")

	close(tunnelDone) // the proxy dropped the tunnel (missed keep-alives)
	select {
	case <-spliced:
	case <-time.After(5 * time.Second):
		t.Fatal("the splice of a data connection outlived its tunnel")
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.Copy(io.Discard, client)
	require.NoError(t, err, "the client's side was closed, not left to time out")
}
