package web

import (
	"context"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/api/sessionapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/services"
)

// activeSessionsTimeout bounds asking the nodes for their live sessions.
const activeSessionsTimeout = 20 * time.Second

// activeSessionsParallel bounds the nodes asked at once.
const activeSessionsParallel = 8

// ActiveSessionsResponse is GET /webapi/sessions/active.
type ActiveSessionsResponse struct {
	Items []ActiveSession `json:"items"`
}

// ActiveSession is a live session the user may join, and its node.
type ActiveSession struct {
	sessionapi.Info
	NodeUUID string `json:"node_uuid"`
	// node is the entry it was listed from, to join it through.
	node proxyapi.NodeEntry
}

// listActiveSessions serves GET /webapi/sessions/active: the live pty
// sessions of the local cluster that the session user may join. As for
// psh sessions ls, each node the user may reach is asked (its `sessions`
// subsystem, dialed through the Router like a terminal, so tunnel and
// peered nodes answer too) with the user's own certificate, and each node
// decides from the user's roles: the proxy keeps no list of its own that
// could show more.
func (s *Server) listActiveSessions(w http.ResponseWriter, r *http.Request, live *liveSession) {
	log := s.cfg.Logger.WithField("user", live.user)
	id, err := s.identity(r.Context(), live)
	if err != nil {
		internalError(w, log, "Could not resolve a web session's roles.", err)
		return
	}
	out, err := s.activeSessions(r.Context(), live, id)
	if err != nil {
		internalError(w, log, "Could not list nodes.", err)
		return
	}
	writeJSON(w, http.StatusOK, ActiveSessionsResponse{Items: out})
}

// dialNodeAsUser opens an SSH connection to node n through the Router,
// as the web session's user with its first login there and the user's
// certificate, for the node's shared-session subsystems (listing and
// joining: the node decides from the user's roles). A nil client and
// no error: an OpenSSH node, where no Postern process holds sessions.
func (s *Server) dialNodeAsUser(ctx context.Context, live *liveSession, id *authz.Identity, n proxyapi.NodeEntry) (*ssh.Client, error) {
	if len(n.Logins) == 0 {
		return nil, trace.NotFound("no login on node %q", n.Hostname)
	}
	login := n.Logins[0]
	conn, route, err := s.cfg.WebSessions.Router.DialHost(ctx, proxy.RouteRequest{
		Target: proxy.Target{Host: n.UUID},
		Access: id.CanReach,
		Authorize: func(node services.Node) error {
			return id.CheckLogin(&node, login)
		},
		Cert: live.cert,
	})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if route.Node.IsOpenSSH() {
		conn.Close()
		return nil, nil
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	_, port, _ := net.SplitHostPort(route.Node.Addr)
	sconn, chans, reqs, err := ssh.NewClientConn(conn, net.JoinHostPort(route.Node.UUID, port), s.cfg.SSHAlgorithms.ClientConfig(&ssh.ClientConfig{
		User:            login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(live.signer)},
		HostKeyCallback: authz.ScopedHostKeyCallback(live.hostCAs, s.cfg.Clock),
	}))
	if !stop() {
		if err == nil {
			sconn.Close()
		}
		return nil, trace.ConnectionProblem(ctx.Err(), "SSH connection to node %q: %v", n.Hostname, ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, trace.ConnectionProblem(err, "SSH connection to node %q: %v", n.Hostname, err)
	}
	return ssh.NewClient(sconn, chans, reqs), nil
}

// activeSessions asks every node of the local cluster the user may
// reach for the live sessions the user may join, oldest first. A node
// that does not answer is left out (and logged).
func (s *Server) activeSessions(ctx context.Context, live *liveSession, id *authz.Identity) ([]ActiveSession, error) {
	log := s.cfg.Logger.WithField("user", live.user)
	nodes, err := authz.ListNodes(ctx, s.cfg.WebSessions.Nodes, id, "")
	if err != nil {
		return nil, trace.Wrap(err)
	}
	ctx, cancel := context.WithTimeout(ctx, activeSessionsTimeout)
	defer cancel()
	var (
		mu  sync.Mutex
		out = []ActiveSession{}
		wg  sync.WaitGroup
	)
	sem := make(chan struct{}, activeSessionsParallel)
	for _, n := range nodes {
		if len(n.Logins) == 0 {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(n proxyapi.NodeEntry) {
			defer wg.Done()
			defer func() { <-sem }()
			got, err := s.nodeActiveSessions(ctx, live, id, n)
			if err != nil {
				log.WithError(err).WithField("node", n.Hostname).Debug("Node did not list its sessions.")
				return
			}
			mu.Lock()
			out = append(out, got...)
			mu.Unlock()
		}(n)
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out, nil
}

// nodeActiveSessions asks one node's `sessions` subsystem as the user.
func (s *Server) nodeActiveSessions(ctx context.Context, live *liveSession, id *authz.Identity, n proxyapi.NodeEntry) ([]ActiveSession, error) {
	client, err := s.dialNodeAsUser(ctx, live, id, n)
	if err != nil || client == nil {
		return nil, trace.Wrap(err)
	}
	stop := context.AfterFunc(ctx, func() { client.Close() })
	defer stop()
	defer client.Close()
	infos, err := sessionapi.List(client, n.Hostname)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	items := make([]ActiveSession, 0, len(infos))
	for _, i := range infos {
		items = append(items, ActiveSession{Info: i, NodeUUID: n.UUID, node: n})
	}
	return items, nil
}
