package authz

import (
	"context"
	"sort"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/services"
)

// NodeLister lists the nodes of a cluster; *services.NodeWatcher is the
// production one (an O(n) copy, fine for a listing, never used to route).
type NodeLister interface {
	GetNodes(ctx context.Context, cluster string) ([]services.Node, error)
}

var _ NodeLister = (*services.NodeWatcher)(nil)

// ListNodes returns the nodes of cluster ("" for all) that id may reach
// with at least one of its certificate's logins, sorted by hostname then
// UUID. Nodes the caller may not reach are left out, never marked: the
// listing must not reveal what RBAC hides. The proxy's `nodes` subsystem
// (psh ls) and GET /webapi/nodes answer with these same entries.
func ListNodes(ctx context.Context, lister NodeLister, id *Identity, cluster string) ([]proxyapi.NodeEntry, error) {
	if id == nil || id.Checker == nil || id.Cert == nil {
		return nil, trace.AccessDenied("no roles")
	}
	nodes, err := lister.GetNodes(ctx, cluster)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := []proxyapi.NodeEntry{}
	for i := range nodes {
		n := &nodes[i]
		logins := id.LoginsOn(n)
		if len(logins) == 0 {
			continue
		}
		e := proxyapi.NodeEntry{UUID: n.UUID, Hostname: n.Hostname, Addr: n.Addr, Labels: n.Labels, Cluster: n.Cluster, Tunnel: n.Tunnel, Logins: logins}
		if n.IsOpenSSH() {
			e.Kind = services.NodeKindOpenSSH
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Hostname != out[j].Hostname {
			return out[i].Hostname < out[j].Hostname
		}
		return out[i].UUID < out[j].UUID
	})
	return out, nil
}
