package web

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/proxy/sshproxy"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
)

// identity is the session user as the SSH proxy would see them: the
// certificate's roles and traits, with the roles fetched live so that a
// role changed or deleted since login takes effect at once.
func (s *Server) identity(ctx context.Context, live *liveSession) (*srv.Identity, error) {
	ext := live.cert.Permissions.Extensions
	id := &srv.Identity{User: live.user, Cert: live.cert, Cluster: ext[services.CertExtensionCluster]}
	if err := json.Unmarshal([]byte(ext[services.CertExtensionRoles]), &id.Roles); err != nil {
		return nil, trace.AccessDenied("web session certificate carries no readable roles")
	}
	if t := ext[services.CertExtensionTraits]; t != "" {
		if err := json.Unmarshal([]byte(t), &id.Traits); err != nil {
			return nil, trace.AccessDenied("web session certificate carries malformed traits")
		}
	}
	checker, err := srv.NewAccessChecker(ctx, s.cfg.WebSessions.Roles, id.Roles, id.Traits)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	id.Checker = checker
	return id, nil
}

// checkLogin allows login on node when the session's certificate carries
// the login and a role grants it there. Unlike the SSH proxy, which cannot
// see the login inside the user's own SSH connection, the web terminal
// knows it, so it checks that exact login before dialing.
func checkLogin(id *srv.Identity, node services.Node, login string) error {
	if !slices.Contains(id.Cert.ValidPrincipals, login) {
		return trace.AccessDenied("login %q is not in the session certificate", login)
	}
	return trace.Wrap(id.Checker.CheckAccessToNode(&node, login))
}

// canReach reports whether one of the session certificate's logins may be
// used on node: the visibility rule of the node list and of routing.
func canReach(id *srv.Identity, node services.Node) bool {
	for _, login := range id.Cert.ValidPrincipals {
		if id.Checker.CheckAccessToNode(&node, login) == nil {
			return true
		}
	}
	return false
}

// listNodes serves GET /webapi/nodes: the same RBAC-filtered listing as
// the proxy's `nodes` subsystem (psh ls), so both show the same nodes
// with the same logins.
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, live *liveSession) {
	id, err := s.identity(r.Context(), live)
	if err != nil {
		internalError(w, s.cfg.Logger.WithField("user", live.user), "Could not resolve a web session's roles.", err)
		return
	}
	items, err := sshproxy.ListNodes(r.Context(), s.cfg.WebSessions.Nodes, id, "")
	if err != nil {
		internalError(w, s.cfg.Logger.WithField("user", live.user), "Could not list nodes.", err)
		return
	}
	writeJSON(w, http.StatusOK, webapi.NodesResponse{Items: items})
}
