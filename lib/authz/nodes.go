package authz

import (
	"context"
	"sort"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/services"
)

// NodeLister lists the nodes of a cluster; *services.NodeWatcher is the
// production one (an O(n) copy, fine for a listing, never used to route).
type NodeLister interface {
	GetNodes(ctx context.Context, cluster string) ([]services.Node, error)
}

var _ NodeLister = (*services.NodeWatcher)(nil)

// NodeEntry is one node of a listing: the proxy's `nodes` subsystem (psh
// ls) and GET /webapi/nodes answer with the same entries.
type NodeEntry struct {
	UUID     string            `json:"uuid"`
	Hostname string            `json:"hostname"`
	Addr     string            `json:"addr"`
	Labels   map[string]string `json:"labels,omitempty"`
	Cluster  string            `json:"cluster"`
	// Logins are the certificate's logins the caller's roles allow on
	// this node.
	Logins []string `json:"logins"`
}

// ListNodes returns the nodes of cluster ("" for all) that id may reach
// with at least one of its certificate's logins, sorted by hostname then
// UUID. Nodes the caller may not reach are left out, never marked: the
// listing must not reveal what RBAC hides.
func ListNodes(ctx context.Context, lister NodeLister, id *Identity, cluster string) ([]NodeEntry, error) {
	if id == nil || id.Checker == nil || id.Cert == nil {
		return nil, trace.AccessDenied("no roles")
	}
	nodes, err := lister.GetNodes(ctx, cluster)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	out := []NodeEntry{}
	for i := range nodes {
		n := &nodes[i]
		logins := id.LoginsOn(n)
		if len(logins) == 0 {
			continue
		}
		out = append(out, NodeEntry{UUID: n.UUID, Hostname: n.Hostname, Addr: n.Addr, Labels: n.Labels, Cluster: n.Cluster, Logins: logins})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Hostname != out[j].Hostname {
			return out[i].Hostname < out[j].Hostname
		}
		return out[i].UUID < out[j].UUID
	})
	return out, nil
}
