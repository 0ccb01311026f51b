package sshproxy

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/events"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// OpenSSH nodes run no Postern process, so nothing on them writes
// session.start and session.end: the proxy, the last Postern hop, does. An
// `ssh -J` hop stays end to end (the proxy never sees the login or the
// commands inside), so what the proxy can vouch for is who connected to
// which node, through which path, when, and how many bytes went each way:
// session.start when the connection to the node is made, session.end (with
// bytes_in, from the user, and bytes_out, to the user) when either side
// closes it. The two share a session_id minted here.
//
// Locks: a lock on the user ends the user's whole connection to the proxy
// (lib/srv), hops included. A lock on the node is the node's own business
// when Postern runs there; a stock sshd knows nothing of locks, so the
// proxy ends every open hop to a node that a lock now covers. Locks and
// certificate lifetimes are the only ways to cut access to such a node.

// auditOpenSSH wraps conn, the proxy's connection to node for id, so that
// it is audited; it emits session.start at once.
func (h *Handler) auditOpenSSH(ctx context.Context, id *authz.Identity, target proxy.Target, via string, node services.Node, conn net.Conn) net.Conn {
	sid := uuid.NewString()
	fields := func() events.Fields {
		return events.Fields{
			events.FieldSessionID:      sid,
			events.FieldServerID:       node.UUID,
			events.FieldServerHostname: node.Hostname,
			events.FieldServerAddr:     node.Addr,
			"node_kind":                services.NodeKindOpenSSH,
		}
	}
	// The end is emitted when the connection closes, long after the
	// request's context ended; keep its values, drop its cancellation.
	bg := context.WithoutCancel(ctx)
	h.emit(ctx, events.SessionStart, id, target, via, fields())
	c := &auditedConn{Conn: conn, closed: make(chan struct{})}
	if h.cfg.Locks != nil {
		go h.endWhenLocked(c, id, node)
	}
	c.end = func() {
		f := fields()
		f[events.FieldBytesIn] = c.in.Load()
		f[events.FieldBytesOut] = c.out.Load()
		h.emit(bg, events.SessionEnd, id, target, via, f)
	}
	return c
}

// auditedConn counts the bytes of a connection and reports its end once.
// It exposes the connection under it (Unwrap) so that a splice can still
// park on the socket and half-close it.
type auditedConn struct {
	net.Conn
	// in is what the user sent to the node (written here), out what the
	// node sent back (read here).
	in, out atomic.Uint64
	once    sync.Once
	end     func()
	// closed is closed by Close.
	closed chan struct{}
}

func (c *auditedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.out.Add(uint64(n))
	return n, err
}

func (c *auditedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.in.Add(uint64(n))
	return n, err
}

// CloseWrite half-closes the connection when the one under it can.
func (c *auditedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

func (c *auditedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		close(c.closed)
		c.end()
	})
	return err
}

// Unwrap is the connection under the counter.
func (c *auditedConn) Unwrap() net.Conn { return c.Conn }

// endWhenLocked closes c when a lock covers node, checking at every change
// of the lock set until c closes. A lock set that is not loaded ends
// nothing (the last good set was applied), as in lib/srv.
func (h *Handler) endWhenLocked(c *auditedConn, id *authz.Identity, node services.Node) {
	for {
		changed := h.cfg.Locks.Changes()
		if err := h.cfg.Locks.Check(services.LockTarget{Node: node.UUID}); services.IsLocked(err) {
			h.cfg.Logger.WithFields(logrus.Fields{"user": id.User, "node": node.UUID, "reason": err.Error()}).Warn("Ending a hop to a locked OpenSSH node.")
			_ = utils.CloseSpliced(c)
			return
		}
		select {
		case <-changed:
		case <-c.closed:
			return
		}
	}
}
