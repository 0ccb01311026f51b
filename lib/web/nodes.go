package web

import (
	"context"
	"net/http"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/proxy"
)

// identity is the session user as the SSH proxy would see them: the
// certificate read by the same parser as on the SSH ports, with the roles
// fetched live so that a role changed or deleted since login takes effect
// at once.
func (s *Server) identity(ctx context.Context, live *liveSession) (*authz.Identity, error) {
	id, err := authz.FromCertificate(live.cert, "")
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if err := id.Load(ctx, s.cfg.WebSessions.Roles); err != nil {
		return nil, trace.Wrap(err)
	}
	return id, nil
}

// nodeStatuser sets the health of OpenSSH nodes in a listing
// (*proxy.Router).
type nodeStatuser interface {
	NodeStatuses(entries []proxyapi.NodeEntry)
}

var _ nodeStatuser = (*proxy.Router)(nil)

// listNodes serves GET /webapi/nodes: the same RBAC-filtered listing as
// the proxy's `nodes` subsystem (psh ls), so both show the same nodes
// with the same logins.
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, live *liveSession) {
	if c := r.URL.Query().Get("cluster"); c != "" && c != s.cfg.ClusterName {
		s.listLeafNodes(w, r, live, c)
		return
	}
	id, err := s.identity(r.Context(), live)
	if err != nil {
		internalError(w, s.cfg.Logger.WithField("user", live.user), "Could not resolve a web session's roles.", err)
		return
	}
	items, err := authz.ListNodes(r.Context(), s.cfg.WebSessions.Nodes, id, "")
	if err != nil {
		internalError(w, s.cfg.Logger.WithField("user", live.user), "Could not list nodes.", err)
		return
	}
	// An OpenSSH node's online or offline is this proxy's health
	// checker's answer (*proxy.Router), the one its dials go by.
	if h, ok := s.cfg.WebSessions.Router.(nodeStatuser); ok {
		h.NodeStatuses(items)
	}
	writeJSON(w, http.StatusOK, webapi.NodesResponse{Items: items})
}
