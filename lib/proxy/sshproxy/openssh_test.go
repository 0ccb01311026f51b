package sshproxy

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/backend/memory"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// An `ssh -J` hop to an OpenSSH node is audited at the proxy: a start when
// the node connection is made, an end with the bytes each way when the
// splice between the user's channel and the node closes, paired by one
// session id. The node here is a real socket that answers like an SSH
// server would (a banner), then echoes.
func TestOpenSSHHopIsAudited(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, nodeConn, served := echoNode(t)

	rec := events.NewRecorder()
	h, err := New(Config{Router: &proxy.Router{}, Deps: observe.Deps{Audit: rec}})
	require.NoError(t, err)
	node := services.Node{UUID: "00000000-0000-4000-8000-000000000001", Hostname: "legacy", Addr: ln.Addr().String(), Kind: services.NodeKindOpenSSH}
	id := &authz.Identity{User: "alice", Login: "alice"}
	conn := h.auditOpenSSH(ctx, id, proxy.Target{Host: "legacy", Port: "22"}, "direct-tcpip", node, nodeConn)

	start, err := rec.Wait(ctx, events.SessionStart, nil)
	require.NoError(t, err)
	require.Equal(t, "alice", start.User)
	require.Equal(t, node.UUID, start.Fields[events.FieldServerID])
	require.Equal(t, services.NodeKindOpenSSH, start.Fields["node_kind"])

	// The user's side of the hop: what the SSH server's channel would be.
	user, channel := net.Pipe()
	spliced := make(chan struct{})
	go func() {
		defer close(spliced)
		_, _, _ = utils.Splice(ctx, channel, conn)
	}()
	banner := make([]byte, len("SSH-2.0-OpenSSH_9.2\r\n"))
	_, err = io.ReadFull(user, banner)
	require.NoError(t, err)
	_, err = user.Write([]byte("hello"))
	require.NoError(t, err)
	echo := make([]byte, 5)
	_, err = io.ReadFull(user, echo)
	require.NoError(t, err)
	require.Equal(t, "hello", string(echo))
	require.NoError(t, user.Close())
	<-spliced
	<-served

	end, err := rec.Wait(ctx, events.SessionEnd, nil)
	require.NoError(t, err)
	require.Equal(t, start.Fields[events.FieldSessionID], end.Fields[events.FieldSessionID])
	require.EqualValues(t, 5, end.Fields[events.FieldBytesIn], "the user sent hello")
	require.EqualValues(t, len(banner)+5, end.Fields[events.FieldBytesOut], "the node sent its banner and the echo")
	require.Len(t, rec.Events(), 2, "one start, one end")
}

// echoNode is a socket that answers like an SSH server (a banner), then
// echoes; served closes when it hung up.
func echoNode(t *testing.T) (net.Listener, net.Conn, <-chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "SSH-2.0-OpenSSH_9.2\r\n")
		_, _ = io.Copy(c, c)
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	return ln, conn, served
}

// A stock sshd knows nothing of locks: a lock on the node ends the open
// hops to it at the proxy, and leaves hops to other nodes alone.
func TestOpenSSHHopEndsWhenTheNodeIsLocked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bk, err := memory.New(memory.Config{})
	require.NoError(t, err)
	defer bk.Close()
	store := services.NewStore(bk)
	locks, err := services.NewLockWatcher(services.LockWatcherConfig{Events: store})
	require.NoError(t, err)
	defer locks.Close()
	require.NoError(t, locks.WaitSynced(ctx))

	rec := events.NewRecorder()
	h, err := New(Config{Router: &proxy.Router{}, Locks: locks, Deps: observe.Deps{Audit: rec}})
	require.NoError(t, err)
	id := &authz.Identity{User: "alice", Login: "alice"}
	hop := func(uuid string) (net.Conn, <-chan struct{}, <-chan struct{}) {
		ln, nodeConn, served := echoNode(t)
		node := services.Node{UUID: uuid, Hostname: "n-" + uuid[len(uuid)-1:], Addr: ln.Addr().String(), Kind: services.NodeKindOpenSSH}
		conn := h.auditOpenSSH(ctx, id, proxy.Target{Host: node.Hostname, Port: "22"}, "direct-tcpip", node, nodeConn)
		user, channel := net.Pipe()
		spliced := make(chan struct{})
		go func() {
			defer close(spliced)
			_, _, _ = utils.Splice(ctx, channel, conn)
		}()
		banner := make([]byte, len("SSH-2.0-OpenSSH_9.2\r\n"))
		_, err := io.ReadFull(user, banner)
		require.NoError(t, err)
		return user, spliced, served
	}
	const lockedID = "00000000-0000-4000-8000-000000000001"
	lockedUser, lockedDone, lockedServed := hop(lockedID)
	otherUser, otherDone, otherServed := hop("00000000-0000-4000-8000-000000000002")

	require.NoError(t, store.UpsertLock(ctx, services.Lock{Target: services.LockTarget{Node: lockedID}, Message: "maintenance"}))
	<-lockedDone
	<-lockedServed
	_, err = lockedUser.Read(make([]byte, 1))
	require.Error(t, err, "the locked node's hop is closed")

	// The other hop still works.
	_, err = otherUser.Write([]byte("x"))
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = io.ReadFull(otherUser, b)
	require.NoError(t, err)
	require.NoError(t, otherUser.Close())
	<-otherDone
	<-otherServed
	require.NoError(t, lockedUser.Close())
}
