package sshproxy

import (
	"context"
	"encoding/json"
	"sort"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv"
)

// NodeLister lists the nodes of a cluster; *services.NodeWatcher is the
// production one (an O(n) copy, fine for a listing, never used to route).
type NodeLister interface {
	GetNodes(ctx context.Context, cluster string) ([]services.Node, error)
}

var _ NodeLister = (*services.NodeWatcher)(nil)

// ListNodes returns the nodes of cluster that id may reach with at least
// one of its certificate's logins, sorted by hostname then UUID. Nodes the
// caller may not reach are left out, never marked: the listing must not
// reveal what RBAC hides.
func ListNodes(ctx context.Context, lister NodeLister, id *srv.Identity, cluster string) ([]proxyapi.NodeEntry, error) {
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
		var logins []string
		for _, login := range id.Cert.ValidPrincipals {
			if id.Checker.CheckAccessToNode(n, login) == nil {
				logins = append(logins, login)
			}
		}
		if len(logins) == 0 {
			continue
		}
		out = append(out, proxyapi.NodeEntry{UUID: n.UUID, Hostname: n.Hostname, Addr: n.Addr, Labels: n.Labels, Cluster: n.Cluster, Logins: logins})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Hostname != out[j].Hostname {
			return out[i].Hostname < out[j].Hostname
		}
		return out[i].UUID < out[j].UUID
	})
	return out, nil
}

// nodesSubsystem serves SubsystemNodes for the local cluster.
func (h *Handler) nodesSubsystem(id *srv.Identity) (srv.SubsystemFunc, error) {
	if h.cfg.Nodes == nil {
		return nil, trace.NotImplemented("this proxy does not list nodes")
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		entries, err := ListNodes(ctx, h.cfg.Nodes, id, h.cfg.Router.ClusterName())
		if err != nil {
			return trace.Wrap(err)
		}
		data, err := json.Marshal(entries)
		if err != nil {
			return trace.Wrap(err)
		}
		_, err = ch.Write(data)
		return trace.Wrap(err)
	}, nil
}
