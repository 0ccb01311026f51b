package sshproxy

import (
	"context"
	"encoding/json"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/authz"
	"github.com/postern-dev/postern/lib/srv"
)

// NodeLister lists the nodes of a cluster.
type NodeLister = authz.NodeLister

// nodesSubsystem serves SubsystemNodes for the local cluster.
func (h *Handler) nodesSubsystem(id *authz.Identity) (srv.SubsystemFunc, error) {
	if h.cfg.Nodes == nil {
		return nil, trace.NotImplemented("this proxy does not list nodes")
	}
	return func(ctx context.Context, ch ssh.Channel) error {
		entries, err := authz.ListNodes(ctx, h.cfg.Nodes, id, h.cfg.Router.ClusterName())
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
