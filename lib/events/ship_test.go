package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
)

// fakeAuth is the auth server's side of shipping: it takes batches, or
// fails them while down.
type fakeAuth struct {
	mu      sync.Mutex
	batches [][]Event
	down    error
	calls   int
	// called is signalled (non-blocking) on every call.
	called chan struct{}
	// block, when set, holds every call until its ctx ends.
	block bool
}

func newFakeAuth() *fakeAuth { return &fakeAuth{called: make(chan struct{}, 100)} }

func (f *fakeAuth) ShipEvents(ctx context.Context, es []Event) error {
	f.mu.Lock()
	f.calls++
	down, block := f.down, f.block
	if down == nil && !block {
		f.batches = append(f.batches, append([]Event(nil), es...))
	}
	f.mu.Unlock()
	select {
	case f.called <- struct{}{}:
	default:
	}
	if block {
		<-ctx.Done()
		return trace.ConnectionProblem(ctx.Err(), "auth unreachable")
	}
	return down
}

func (f *fakeAuth) setDown(err error) {
	f.mu.Lock()
	f.down = err
	f.mu.Unlock()
}

func (f *fakeAuth) shipped() (users []string, batches int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.batches {
		for _, e := range b {
			users = append(users, e.User)
		}
	}
	return users, len(f.batches)
}

// TestShipToAuth: a node-only process's events go to the file and, in
// batches, to auth; while auth is down the batch is retried with backoff
// on the clock and nothing is lost; once auth is back everything arrives
// in order.
func TestShipToAuth(t *testing.T) {
	fa := newFakeAuth()
	f := newFixture(t, func(c *Config) {
		c.Backend = nil
		c.Remote = fa
		c.BatchSize = 3
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 7; i++ {
		f.log.Emit(ctx, Event{Type: SessionStart, User: fmt.Sprint("u", i)})
	}
	f.flush(t)
	users, batches := fa.shipped()
	require.Equal(t, []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6"}, users)
	require.GreaterOrEqual(t, batches, 3, "at most BatchSize per shipment")
	require.Len(t, f.lines(t), 7, "the local file is written too")

	// Auth goes down: the batch waits and is retried at 1s, 2s, 4s...
	for len(fa.called) > 0 {
		<-fa.called
	}
	fa.setDown(trace.ConnectionProblem(nil, "connection refused"))
	f.log.Emit(ctx, Event{Type: SessionEnd, User: "late"})
	<-fa.called
	for _, d := range []time.Duration{DefaultRetryMin, 2 * DefaultRetryMin} {
		require.NoError(t, f.clock.BlockUntilContext(ctx, 1))
		f.clock.Advance(d)
		select {
		case <-fa.called:
		case <-ctx.Done():
			t.Fatal("no retry after", d)
		}
	}
	// Emit never blocks meanwhile, and the file keeps up.
	f.log.Emit(ctx, Event{Type: SessionEnd, User: "later"})
	require.NoError(t, f.log.sinks[0].flushFor(ctx))
	require.Len(t, f.lines(t), 9)

	// Waiting on its next backoff, the shipper has counted three errors.
	require.NoError(t, f.clock.BlockUntilContext(ctx, 1))
	require.Equal(t, 3.0, counter(t, f.reg, "postern_audit_write_errors_total", "sink", "remote"))
	fa.setDown(nil)
	f.clock.Advance(4 * DefaultRetryMin)
	f.flush(t)
	users, _ = fa.shipped()
	require.Equal(t, []string{"late", "later"}, users[7:])
	require.Zero(t, counter(t, f.reg, "postern_audit_dropped_total", "sink", "remote"))
}

// TestShipRefusedBatchDropped: a batch auth refuses for good is dropped,
// not retried forever in front of the events behind it.
func TestShipRefusedBatchDropped(t *testing.T) {
	fa := newFakeAuth()
	fa.setDown(trace.BadParameter("event type %q may not be shipped by a host", "auth.login"))
	f := newFixture(t, func(c *Config) { c.Backend = nil; c.Remote = fa })
	f.log.Emit(context.Background(), Event{Type: AuthLogin, User: "forged"})
	f.flush(t)
	require.Equal(t, 1.0, counter(t, f.reg, "postern_audit_dropped_total", "sink", "remote"))
	fa.setDown(nil)
	f.log.Emit(context.Background(), Event{Type: SessionStart, User: "next"})
	f.flush(t)
	users, _ := fa.shipped()
	require.Equal(t, []string{"next"}, users)
	fa.mu.Lock()
	defer fa.mu.Unlock()
	require.Equal(t, 2, fa.calls, "the refused batch was tried once")
}

// TestShipQueueBoundedAndCloseDeadline: with auth hanging, Emit never
// blocks and nothing is dropped however small the queue: the events wait
// in the file (pending counts them); Close gives up on shipping after its
// grace, and the file has everything for the next start.
func TestShipQueueBoundedAndCloseDeadline(t *testing.T) {
	fa := newFakeAuth()
	fa.block = true
	f := newFixture(t, func(c *Config) {
		c.Backend = nil
		c.Remote = fa
		c.QueueSize = 4
		c.BatchSize = 1
		c.BackendTimeout = time.Hour
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.log.Emit(ctx, Event{Type: SessionStart, User: "first"})
	<-fa.called // the shipper is stuck on the first batch
	for i := 0; i < 20; i++ {
		f.log.Emit(ctx, Event{Type: SessionStart, User: fmt.Sprint("u", i)})
		// The file keeps up (its own queue, flushed alone).
		require.NoError(t, f.log.sinks[0].flushFor(ctx))
	}
	require.Len(t, f.lines(t), 21)
	require.Zero(t, counter(t, f.reg, "postern_audit_dropped_total", "sink", "remote"))
	require.Equal(t, 21.0, gauge(t, f.reg, "postern_audit_pending", "sink", "remote"))

	closed := make(chan error, 1)
	go func() { closed <- f.log.Close() }()
	require.NoError(t, f.clock.BlockUntilContext(ctx, 1))
	f.clock.Advance(DefaultCloseGrace)
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Close did not give up on a hanging auth server")
	}
}

// TestShipCloseFlushes: events emitted just before Close are shipped by it.
func TestShipCloseFlushes(t *testing.T) {
	fa := newFakeAuth()
	f := newFixture(t, func(c *Config) { c.Backend = nil; c.Remote = fa })
	for i := 0; i < 5; i++ {
		f.log.Emit(context.Background(), Event{Type: SessionEnd, User: fmt.Sprint("u", i)})
	}
	require.NoError(t, f.log.Close())
	users, _ := fa.shipped()
	require.Len(t, users, 5)
}

func TestShippedEvent(t *testing.T) {
	now := start
	in := Event{
		Type: SessionStart, Time: start.Add(-time.Minute), ID: "local-1", User: "alice", Cluster: "postern",
		Fields: Fields{FieldServerID: "someone-else", FieldSessionID: "s1", FieldEmitterID: "forged", "cluster": "x"},
	}
	got, err := ShippedEvent(in, now, "real", "node-uuid", "node")
	require.NoError(t, err)
	require.Equal(t, "real", got.Cluster)
	require.Equal(t, "node-uuid", got.Fields[FieldServerID], "a node speaks only for itself")
	require.Equal(t, "node-uuid", got.Fields[FieldEmitterID])
	require.Equal(t, "node", got.Fields[FieldEmitterRole])
	require.Equal(t, "s1", got.Fields[FieldSessionID])
	require.Equal(t, start.Add(-time.Minute), got.Time)
	require.NotEqual(t, "local-1", got.ID)
	again, err := ShippedEvent(in, now, "real", "node-uuid", "node")
	require.NoError(t, err)
	require.Equal(t, got.ID, again.ID, "a re-shipped event keeps its id")
	other, err := ShippedEvent(in, now, "real", "other-node", "node")
	require.NoError(t, err)
	require.NotEqual(t, got.ID, other.ID, "another host cannot reach this event's id")

	// A proxy's server_id is the node it routed to.
	px, err := ShippedEvent(Event{Type: AccessDenied, Fields: Fields{FieldServerID: "target"}}, now, "real", "proxy-uuid", "proxy")
	require.NoError(t, err)
	require.Equal(t, "target", px.Fields[FieldServerID])
	require.Equal(t, now, px.Time, "no time: now")
	require.NotEmpty(t, px.ID)

	future, err := ShippedEvent(Event{Type: SessionEnd, Time: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)}, now, "real", "n", "node")
	require.NoError(t, err)
	require.Equal(t, now, future.Time)

	// A node's word for why it ended a root user's connection reaches
	// auth's log.
	_, err = ShippedEvent(Event{Type: ConnTerminated, User: "alice", Fields: Fields{FieldReason: "trust removed"}}, now, "real", "n", "node")
	require.NoError(t, err)

	for _, typ := range []string{AuthLogin, AuthFailed, HostJoin, APIDenied, "", "made.up"} {
		_, err := ShippedEvent(Event{Type: typ}, now, "real", "n", "node")
		require.True(t, trace.IsBadParameter(err), "%q: %v", typ, err)
	}
}

// TestBackendCreateOnce: the same event written twice is one record.
func TestBackendCreateOnce(t *testing.T) {
	f := newFixture(t, nil)
	e := Event{Type: SessionStart, ID: "fixed", Time: start, User: "alice"}
	f.log.Emit(context.Background(), e)
	f.log.Emit(context.Background(), e)
	f.flush(t)
	items, err := f.backend.GetRange(context.Background(), "/events/", 0)
	require.NoError(t, err)
	require.Len(t, items, 1)
	require.Zero(t, counter(t, f.reg, "postern_audit_write_errors_total", "sink", "backend"))
}

var _ = errors.New
