package web

import (
	"context"
	"net/http"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/proxy"
	"github.com/postern-dev/postern/lib/utils"
)

// ClusterRouter is what the web backend asks about leaf clusters
// (*proxy.Router): the clusters a user may reach, and a leaf's nodes as
// the leaf's RBAC shows them to the user.
type ClusterRouter interface {
	Sites(ctx context.Context, cert *ssh.Certificate) []proxyapi.Site
	LeafNodes(ctx context.Context, cluster string, cert *ssh.Certificate, source string) ([]proxyapi.NodeEntry, error)
}

var _ ClusterRouter = (*proxy.Router)(nil)

// listClusters serves GET /webapi/clusters: the same set as the SSH
// proxy's `proxysites` for the session's certificate (a leaf the user's
// roles map to nothing in is not listed).
func (s *Server) listClusters(w http.ResponseWriter, r *http.Request, live *liveSession) {
	var sites []proxyapi.Site
	if c := s.cfg.WebSessions.Clusters; c != nil {
		sites = c.Sites(r.Context(), live.cert)
	} else {
		sites = []proxyapi.Site{{Name: s.cfg.ClusterName, Status: proxyapi.SiteOnline, LastConnected: s.cfg.Clock.Now().UTC()}}
	}
	items := make([]webapi.ClusterEntry, 0, len(sites))
	for _, site := range sites {
		items = append(items, webapi.ClusterEntry{Name: site.Name, Status: site.Status, LastConnected: site.LastConnected, Local: site.Name == s.cfg.ClusterName})
	}
	writeJSON(w, http.StatusOK, webapi.ClustersResponse{Items: items})
}

// listLeafNodes answers GET /webapi/nodes?cluster=LEAF: what the leaf
// lets the session user see. A cluster that is not a reachable leaf, or
// whose leaf refuses the user: 404 `cluster "X" not found`, one answer
// for all.
func (s *Server) listLeafNodes(w http.ResponseWriter, r *http.Request, live *liveSession, cluster string) {
	c := s.cfg.WebSessions.Clusters
	if c == nil {
		writeError(w, http.StatusNotFound, trace.UserMessage(trace.NotFound("cluster %q not found", cluster)))
		return
	}
	items, err := c.LeafNodes(r.Context(), cluster, live.cert, remoteAddrOf(r))
	switch {
	case trace.IsNotFound(err):
		s.cfg.Logger.WithError(err).WithFields(map[string]any{"user": live.user, "cluster": cluster}).Debug("Leaf node list refused.")
		writeError(w, http.StatusNotFound, trace.UserMessage(err))
		return
	case err != nil:
		s.cfg.Logger.WithError(err).WithFields(map[string]any{"user": live.user, "cluster": cluster}).Warn("Cannot list a leaf cluster's nodes.")
		writeError(w, http.StatusBadGateway, trace.UserMessage(err))
		return
	}
	writeJSON(w, http.StatusOK, webapi.NodesResponse{Items: items})
}

func remoteAddrOf(r *http.Request) string {
	if a := utils.ClientAddr(r.Context()); a != "" {
		return a
	}
	return r.RemoteAddr
}
