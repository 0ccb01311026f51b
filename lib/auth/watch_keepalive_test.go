package auth

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/services"
)

// TestWatchLeavesAFrozenServer: a node watch open on an auth server that
// then freezes (SIGSTOP: the connection stays up, nothing more comes) ends
// once the server has been silent for the watch's silence period, naming
// why, and the server is marked suspect, so the owner's re-opened watch
// goes to the other server and sees what happens there. Before, the watch
// waited forever and its owner's view stood still: nodes that heartbeat
// through the other server expired from a proxy's view.
func TestWatchLeavesAFrozenServer(t *testing.T) {
	env := newTestAuth(t)
	front := startAPI(t, env)
	front.keepAlive = 50 * time.Millisecond
	f := newFreezer(t, env.addr)
	back := startAPI(t, env)
	back.keepAlive = 50 * time.Millisecond
	other := env.addr

	node := env.newHostNode(t, "node1", RoleProxy)
	clt, err := NewClient(ClientConfig{Addr: f.addr() + "," + other, Identity: node.id, Deps: observe.Deps{Clock: env.clock}, DialTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer clt.Close()
	const silence = 600 * time.Millisecond
	clt.watchSilence = silence
	ctx := context.Background()

	w, err := clt.NewWatcher(ctx, backend.Watch{Prefixes: []string{services.NodesPrefix()}})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)

	// Keep-alives are not events: a quiet stream stays open past many
	// silence periods' worth of pings...
	quiet := time.NewTimer(3 * silence)
	select {
	case ev := <-w.Events():
		t.Fatalf("a keep-alive was delivered as an event: %+v", ev)
	case <-w.Done():
		t.Fatalf("a live, quiet stream ended: %v", w.Error())
	case <-quiet.C:
	}

	// ...until the server freezes.
	f.freeze()
	start := time.Now()
	select {
	case <-w.Done():
	case <-time.After(10 * silence):
		t.Fatal("the watch on a frozen server did not end")
	}
	require.Less(t, time.Since(start), 3*silence)
	require.True(t, trace.IsConnectionProblem(w.Error()), "%v", w.Error())
	require.Contains(t, w.Error().Error(), "sent nothing on the watch")
	require.Equal(t, 1, clt.servers.current(), "the frozen server is suspect")

	// The re-opened watch is on the other server and sees a heartbeat.
	w2, err := clt.NewWatcher(ctx, backend.Watch{Prefixes: []string{services.NodesPrefix()}})
	require.NoError(t, err)
	defer w2.Close()
	require.Equal(t, backend.OpInit, (<-w2.Events()).Type)
	now := env.clock.Now()
	require.NoError(t, clt.UpsertNode(ctx, services.Node{UUID: "node1", Hostname: "node1", Addr: node.addr, LastHeartbeat: now, Expires: now.Add(time.Minute)}))
	select {
	case ev := <-w2.Events():
		require.Equal(t, backend.OpPut, ev.Type)
	case <-time.After(5 * time.Second):
		t.Fatal("no event on the re-opened watch")
	}
	f.thaw()
}

// TestWatchOpenOnAFrozenServer: a watch opened while the first server is
// frozen on a pooled connection goes to the other one within the silence
// period, instead of waiting for headers forever.
func TestWatchOpenOnAFrozenServer(t *testing.T) {
	env := newTestAuth(t)
	startAPI(t, env)
	f := newFreezer(t, env.addr)
	startAPI(t, env)
	other := env.addr

	node := env.newHostNode(t, "node1", RoleProxy)
	clt, err := NewClient(ClientConfig{Addr: f.addr() + "," + other, Identity: node.id, Deps: observe.Deps{Clock: env.clock}, DialTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer clt.Close()
	const silence = 600 * time.Millisecond
	clt.watchSilence = silence
	ctx := context.Background()
	_, err = clt.Ping(ctx) // a pooled connection to the first server
	require.NoError(t, err)
	f.freeze()

	start := time.Now()
	_, err = clt.NewWatcher(ctx, backend.Watch{Prefixes: []string{services.NodesPrefix()}})
	require.Error(t, err, "the open on the frozen server is given up")
	require.Less(t, time.Since(start), 3*silence)
	w, err := clt.NewWatcher(ctx, backend.Watch{Prefixes: []string{services.NodesPrefix()}})
	require.NoError(t, err, "the next open goes to the other server")
	defer w.Close()
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)
	f.thaw()
}

// TestWatchSlowOwnerIsNotSilence: an owner that stops reading its events
// for longer than the silence period (the stream backs up behind it) does
// not get its live watch ended and its server marked suspect: the time
// spent waiting on the owner is not the server's silence. The stream is a
// pipe the test writes, as a server would: events, then keep-alives.
func TestWatchSlowOwnerIsNotSilence(t *testing.T) {
	const silence = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	w := &remoteWatcher{
		events: make(chan backend.Event, 1), done: make(chan struct{}), cancel: cancel,
		silence: newSilenceGuard(silence, func() { cancel(); pr.CloseWithError(context.Canceled) }),
		silent:  func(err error) error { return trace.ConnectionProblem(err, "silent") },
	}
	w.wg.Add(1)
	go w.run(ctx, &http.Response{Body: pr})
	defer func() { cancel(); pw.Close(); w.wg.Wait() }()

	write := func(line string) {
		_, err := pw.Write([]byte(line + "\n"))
		require.NoError(t, err)
	}
	write(`{"type":"init"}`)
	write(`{"type":"put","key":"/nodes/c/a"}`)
	// The reader now holds the put, waiting for the owner (the queue of 1
	// holds init). The owner stays away for several silence periods.
	select {
	case <-w.Done():
		t.Fatalf("the watch ended while its owner was slow: %v", w.Error())
	case <-time.After(4 * silence):
	}
	require.Equal(t, backend.OpInit, (<-w.Events()).Type)
	require.Equal(t, backend.OpPut, (<-w.Events()).Type)

	// Once the owner reads again, silence counts again.
	select {
	case <-w.Done():
		require.True(t, trace.IsConnectionProblem(w.Error()), "%v", w.Error())
	case <-time.After(10 * silence):
		t.Fatal("a silent stream was not ended")
	}
}
